// One micro-batch, one optimizer step, and the agreement on a failed read (see step_runner.h).
// Collective: every rank calls these in the same order.
#include "train/step_runner.h"

#include <ATen/record_function.h>

#include <exception>
#include <thread>

#include "core/error.h"
#include "model/flops.h"

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

model::LossRows batch_rows(const data::Batch& b, int64_t ttt_length, c10::Device device) {
  if (b.sharded()) {
    return model::LossRows::build_shard(b.full_loss_mask, ttt_length, device, b.shard_offset,
                                        b.shard_local);
  }
  return model::LossRows::build(b.loss_mask, ttt_length, device, b.documents);
}

model::StepOutput forward_micro_batch(model::Eagle3DraftImpl& draft, const model::TargetHead& head,
                                      const model::LossRows& rows, const data::Batch& b,
                                      c10::Device device, const model::LossOptions& loss) {
  return model::ttt_step(draft, head, rows, b.input_ids.to(device, true),
                         b.attention_mask.to(device, true), b.loss_mask.to(device, true),
                         b.aux_hidden.to(device, true), b.target_hidden.to(device, true), loss);
}

void StepRunner::micro_batch(const data::Batch& batch, bool last) {
  p_.engine->set_sync_gradients(!p_.accumulate_locally || last);
  ++micro_batches_;
  // Real tokens only: padding is neither throughput nor model FLOPs. A sequence-parallel
  // slice counts its own draft positions (the window's halo is the next rank's).
  const at::Tensor valid = (batch.sharded() ? batch.attention_mask.narrow(1, 0, batch.shard_local)
                                            : batch.attention_mask)
                               .sum(1)
                               .to(at::kLong)
                               .contiguous();
  tokens_ += valid.sum().item<int64_t>();
  // Loss rows from the host copy of loss_mask: no device sync (see model::LossRows).
  const auto rows = batch_rows(batch, p_.loss.ttt_length, p_.device);
  if (batch.sharded()) {
    // The group computes the sample's decoder layers together (each rank its positions, and
    // heads / P of the attention over all of them) and the head on its own loss rows.
    const int64_t P = p_.loss.seq_group ? p_.loss.seq_group->size() : 1;
    const std::vector<int64_t> whole{rows.shard_total};
    const auto with_rows =
        model::count_step_flops(p_.draft_cfg, whole, p_.loss.ttt_length, rows.count);
    const auto without =
        model::count_step_flops(p_.draft_cfg, whole, p_.loss.ttt_length,
                                std::vector<int64_t>(static_cast<size_t>(p_.loss.ttt_length), 0));
    flops_ += without.total() / static_cast<double>(P) + (with_rows.total() - without.total());
  } else {
    std::vector<int64_t> lengths = batch.documents;
    if (lengths.empty()) {
      const int64_t* v = valid.data_ptr<int64_t>();
      lengths.assign(v, v + valid.numel());
    }
    flops_ +=
        model::count_step_flops(p_.draft_cfg, lengths, p_.loss.ttt_length, rows.count).total();
  }
  // fsdp:: scopes name the phases in --profile traces (free when not profiling).
  auto out = [&] {
    RECORD_USER_SCOPE("fsdp::forward");
    PhaseScope phase(p_.timer, PhaseTimer::kForward);
    return forward_micro_batch(*p_.draft, *p_.head, rows, batch, p_.device, p_.loss);
  }();
  {
    RECORD_USER_SCOPE("fsdp::backward");
    PhaseScope phase(p_.timer, PhaseTimer::kBackward);
    out.loss.backward();
  }
  out.loss = at::Tensor();
  outputs_.push_back(std::move(out));
}

std::vector<model::StepOutput> StepRunner::take_outputs() {
  std::vector<model::StepOutput> outs;
  outs.swap(outputs_);
  return outs;
}

shard::StepResult StepRunner::optimizer_step(double lr, double max_grad_norm) {
  RECORD_USER_SCOPE("fsdp::optimizer_step");
  PhaseScope phase(p_.timer, PhaseTimer::kOptimizer);
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
