// Learning-rate schedules (see lr_schedule.h); pure arithmetic, must never keep state. The
// warmup is written once (warmup_lr) and shared by every decay.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fsdp::optim {

int64_t warmup_steps(double warmup_ratio, int64_t total_steps) {
  FSDP_USAGE_CHECK(warmup_ratio >= 0.0 && warmup_ratio <= 1.0,
                   str("warmup ratio ", warmup_ratio, " is not in [0, 1]"),
                   "set --warmup-ratio to a fraction such as 0.015");
  return static_cast<int64_t>(warmup_ratio * static_cast<double>(total_steps));
}

void check_schedule(int64_t total_steps, int64_t warmup) {
  FSDP_USAGE_CHECK(total_steps >= 1, str("total steps ", total_steps, " must be at least 1"),
                   "set --total-steps or --num-epochs so that training has steps");
  FSDP_USAGE_CHECK(warmup >= 0 && warmup <= total_steps,
                   str("warmup steps ", warmup, " not in [0, total steps ", total_steps, "]"),
                   "lower --warmup-ratio or --warmup-steps");
}

double warmup_lr(double base_lr, int64_t step, int64_t warmup) {
  return base_lr * static_cast<double>(step) / static_cast<double>(warmup);
}

double warmup_cosine_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup) {
  check_schedule(total_steps, warmup);
  const int64_t n = std::clamp<int64_t>(step, 1, total_steps);
  if (n <= warmup) return warmup_lr(base_lr, n, warmup);
  if (total_steps == warmup) return 0.0;
  const double progress =
      static_cast<double>(n - 1 - warmup) / static_cast<double>(total_steps - warmup);
  return base_lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double warmup_linear_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup) {
  check_schedule(total_steps, warmup);
  const int64_t n = std::clamp<int64_t>(step, 1, total_steps);
  if (n <= warmup) return warmup_lr(base_lr, n, warmup);
  return base_lr * static_cast<double>(std::max<int64_t>(total_steps - n, 0)) /
         static_cast<double>(std::max<int64_t>(total_steps - warmup, 1));
}

double warmup_constant_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup) {
  check_schedule(total_steps, warmup);
  const int64_t n = std::clamp<int64_t>(step, 1, total_steps);
  if (n <= warmup) return warmup_lr(base_lr, n, warmup);
  return base_lr;
}

double scheduled_lr(LrDecay decay, double base_lr, int64_t step, int64_t total_steps,
                    int64_t warmup) {
  switch (decay) {
    case LrDecay::kCosine:
      return warmup_cosine_lr(base_lr, step, total_steps, warmup);
    case LrDecay::kLinear:
      return warmup_linear_lr(base_lr, step, total_steps, warmup);
    case LrDecay::kConstant:
      return warmup_constant_lr(base_lr, step, total_steps, warmup);
  }
  FSDP_FAIL(str("unknown learning-rate decay ", static_cast<int>(decay)),
            "a bug in fsdp-train: please report it");
}

}  // namespace fsdp::optim
