// StepHealth (step_health.h): the same checks for host and device step results; device ones
// cost one host read per flush instead of one per step.
#include "train/step_health.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace fsdp::train {

void StepHealth::check_consecutive(int64_t max_run, int64_t last_step) const {
  FSDP_CHECK(max_run < max_consecutive_,
             fsdp::str("aborting: ", max_run,
                       " consecutive optimizer steps had non-finite gradients (last at step ",
                       last_step, " or before)"),
             "lower --learning-rate, check the features for outliers, or resume from the last "
             "checkpoint with --mixed-precision fp32");
}

void StepHealth::add(const shard::StepResult& r, int64_t step) {
  if (r.resolved) {
    flush();
    last_norm_ = r.grad_norm;
    if (!r.skipped) {
      consecutive_ = 0;
      return;
    }
    ++consecutive_;
    ++*skipped_steps_;
    FSDP_LOG0(kWarn) << "step " << step << ": gradients are not finite (norm " << r.grad_norm
                     << "); step skipped, weights unchanged";
    check_consecutive(consecutive_, step);
    return;
  }
  FSDP_CHECK(r.skipped_t.defined() && r.grad_norm_t.defined(),
             "StepHealth: an unresolved step result without device values",
             "pass the engine's StepResult unchanged");
  const at::Tensor s = r.skipped_t.to(at::kDouble);
  if (!pending_) {
    pending_ = true;
    first_step_ = step;
    skipped_t_ = at::zeros_like(s);
    run_t_ = at::full_like(s, static_cast<double>(consecutive_));
    max_run_t_ = run_t_.clone();
  }
  skipped_t_.add_(s);
  run_t_ = (run_t_ + s) * s;  // grows on a skipped step, back to 0 on an applied one
  max_run_t_ = at::maximum(max_run_t_, run_t_);
  norm_t_ = r.grad_norm_t;
  last_step_ = step;
}

void StepHealth::flush() {
  if (!pending_) return;
  pending_ = false;
  at::Tensor host =
      at::stack({skipped_t_, run_t_, max_run_t_, norm_t_.to(at::kDouble)}).to(at::kCPU);
  const double* v = host.data_ptr<double>();
  const auto skipped = static_cast<int64_t>(v[0]);
  consecutive_ = static_cast<int>(v[1]);
  last_norm_ = v[3];
  if (skipped > 0) {
    *skipped_steps_ += skipped;
    FSDP_LOG0(kWarn) << "steps " << first_step_ << "-" << last_step_ << ": " << skipped
                     << " optimizer step(s) had non-finite gradients and were skipped (weights "
                        "unchanged); newest gradient norm "
                     << last_norm_;
  }
  check_consecutive(static_cast<int64_t>(v[2]), last_step_);
}

}  // namespace fsdp::train
