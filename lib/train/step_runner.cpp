// One micro-batch, one optimizer step, and the agreement on a failed read (see step_runner.h).
// Collective: every rank calls these in the same order.
#include "train/step_runner.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <exception>
#include <thread>

#include "core/error.h"
#include "shard/engine.h"

namespace fsdp::train {

namespace {
// A phase of the timer for the lifetime of the scope (nothing without a timer).
class PhaseScope {
 public:
  PhaseScope(PhaseTimer* timer, PhaseTimer::Phase phase) : timer_(timer), phase_(phase) {
    if (timer_) timer_->begin(phase_);
  }
  ~PhaseScope() {
    if (timer_) timer_->end(phase_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer* timer_;
  PhaseTimer::Phase phase_;
};
}  // namespace

std::optional<data::Batch> read_agreed(const std::function<std::optional<data::Batch>()>& read,
                                       const ReadAgreement& agree, const char* what,
                                       const std::function<void(ReadFailure)>& before_failure) {
  std::optional<data::Batch> batch;
  std::exception_ptr failure;
  ReadFailure kind = ReadFailure::kOtherRank;
  try {
    batch = read();
  } catch (const data::BadSampleError&) {
    failure = std::current_exception();
    kind = ReadFailure::kBadSample;
  } catch (const std::exception&) {
    failure = std::current_exception();
    kind = ReadFailure::kLoaderError;
  }
  // One CPU flag per micro-batch, before its collectives.
  if (agree.world > 1 ? agree.any_rank(failure != nullptr) : failure != nullptr) {
    if (before_failure) before_failure(kind);
    if (failure) std::rethrow_exception(failure);
    stop_for_other_rank(what, agree.other_rank_wait);
  }
  return batch;
}

void stop_for_other_rank(const char* what, std::chrono::seconds wait) {
  // The rank that failed reports its error and stops the job; this one only speaks if that did
  // not happen within a few seconds (its report waits 2 s on ranks other than 0).
  std::this_thread::sleep_for(wait);
  FSDP_USAGE_FAIL(fsdp::str("stopping: another rank's ", what, " failed (its error is above)"),
                  "fix or remove that file (or pass --skip-bad-samples), then --resume");
  std::abort();  // not reached: the check throws
}

void StepRunner::micro_batch(const data::Batch& batch, bool last) {
  p_.engine->set_sync_gradients(!p_.accumulate_locally || last);
  ++micro_batches_;
  // Real tokens only: padding is neither throughput nor model FLOPs. A sequence-parallel
  // slice counts its own draft positions (the window's halo is the next rank's).
  const at::Tensor valid = (batch.sharded() ? batch.attention_mask.narrow(1, 0, batch.shard_local)
                                            : batch.attention_mask)
                               .sum()
                               .to(at::kLong);
  tokens_ += valid.item<int64_t>();
  // fsdp:: scopes name the phases in --profile traces (free when not profiling).
  auto out = [&] {
    RECORD_USER_SCOPE("fsdp::forward");
    PhaseScope phase(p_.timer, PhaseTimer::kForward);
    return p_.algorithm->forward(batch, /*training=*/true);
  }();
  flops_ += out.flops;
  if (out.normaliser.defined()) {
    const at::Tensor n = out.normaliser.detach().to(at::kDouble).reshape({1});
    normaliser_ = normaliser_.defined() ? normaliser_ + n : n;
  }
  {
    RECORD_USER_SCOPE("fsdp::backward");
    PhaseScope phase(p_.timer, PhaseTimer::kBackward);
    out.loss.backward();
  }
  outputs_.push_back(std::move(out.sums));
}

std::vector<at::Tensor> StepRunner::take_outputs() {
  std::vector<at::Tensor> outs;
  outs.swap(outputs_);
  return outs;
}

shard::StepResult StepRunner::optimizer_step(double lr, double max_grad_norm) {
  RECORD_USER_SCOPE("fsdp::optimizer_step");
  PhaseScope phase(p_.timer, PhaseTimer::kOptimizer);
  if (normaliser_.defined()) {
    // The engine averaged the gradients over its ranks: the sum over all of them, divided by the
    // global normaliser, is that average times the ranks over the normaliser. Nothing was
    // supervised anywhere (0): the gradients are zero and stay so.
    at::Tensor total = normaliser_.to(at::kCPU).clone();
    normaliser_ = at::Tensor();
    if (p_.sum_over_ranks) p_.sum_over_ranks(total);
    const double n = total.item<double>();
    const double ranks = static_cast<double>(p_.engine->shard_size() * p_.engine->replicate_size());
    if (n > 0) p_.engine->scale_gradients(ranks / n);
  }
  return p_.engine->step(lr, max_grad_norm);
}

std::pair<int64_t, double> StepRunner::take_work() {
  const std::pair<int64_t, double> work{tokens_, flops_};
  tokens_ = 0;
  flops_ = 0;
  return work;
}

int64_t StepRunner::take_micro_batches() {
  const int64_t n = micro_batches_;
  micro_batches_ = 0;
  return n;
}

}  // namespace fsdp::train
