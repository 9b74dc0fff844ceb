// One micro-batch and one optimizer step of the loop (docs/reference.md §6), and the protocol
// every rank follows when reading a micro-batch fails: the ranks agree on the failure before
// the micro-batch's collectives, so that no rank waits forever in one. Knows nothing of
// intervals, checkpoints or logging (cadence.h, the loop).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "data/loader.h"
#include "shard/engine.h"
#include "train/algo/algorithm.h"
#include "train/phase_timer.h"

namespace fsdp::train {

// Why reading the next micro-batch failed.
enum class ReadFailure {
  kBadSample,    // this rank read a bad sample (data::BadSampleError, without --skip-bad-samples)
  kLoaderError,  // this rank's loader failed otherwise (memory, a file system gone)
  kOtherRank,    // this rank read its micro-batch, another rank failed
};

// How the ranks agree: any_rank(mine) is true on every rank when `mine` is on any (collective;
// only called with more than one rank).
struct ReadAgreement {
  int world = 1;
  std::function<bool(bool)> any_rank;
  // How long a rank whose peer failed waits for that peer's own report before reporting.
  std::chrono::seconds other_rank_wait{6};
};

// Reads the next micro-batch with `read` (nullopt: the epoch's data is consumed). When the read
// fails on any rank, every rank runs before_failure (the loop saves the last completed step
// there); then the failing rank rethrows its error and the others stop with a UsageError
// naming `what` (after other_rank_wait).
std::optional<data::Batch> read_agreed(const std::function<std::optional<data::Batch>()>& read,
                                       const ReadAgreement& agree, const char* what,
                                       const std::function<void(ReadFailure)>& before_failure);

// On a rank whose peer's `what` failed: waits `wait` for that rank's report, then throws.
[[noreturn]] void stop_for_other_rank(const char* what, std::chrono::seconds wait);

// The micro-batches of one optimizer step: forward and backward of each, then the step.
class StepRunner {
 public:
  struct Parts {
    algo::Algorithm* algorithm = nullptr;  // the forward (its losses divided or normalised)
    shard::ShardEngine* engine = nullptr;
    bool accumulate_locally = false;  // --accumulate-locally: reduce at the step's end only
    PhaseTimer* timer = nullptr;      // times forward, backward and the optimizer step (or none)
    // Sums a [1] float64 CPU tensor over the data-parallel ranks in place (collective): the
    // step's loss normaliser (algo::MicroBatchResult::normaliser). Needed by algorithms that
    // give one; nothing to do with one rank.
    std::function<void(at::Tensor&)> sum_over_ranks;
  };
  explicit StepRunner(Parts parts) : p_(std::move(parts)) {}

  // Forward and backward of one micro-batch; `last` is true for the step's last micro-batch.
  void micro_batch(const data::Batch& batch, bool last);
  // The step's micro-batch metric sums (algo::MicroBatchResult::sums), in order; cleared by the
  // call. Counted in
  // the metrics once the optimizer step completes: a checkpoint's metric sums then cover
  // exactly the steps it holds (a bad sample can stop the run inside a step).
  std::vector<at::Tensor> take_outputs();
  // The optimizer step at learning rate `lr`.
  shard::StepResult optimizer_step(double lr, double max_grad_norm);
  // The step's valid tokens and FLOPs so far; reset by the call.
  std::pair<int64_t, double> take_work();
  // Micro-batches run since the last call (packed ones with --packing); reset by the call.
  int64_t take_micro_batches();

 private:
  Parts p_;
  std::vector<at::Tensor> outputs_;
  at::Tensor normaliser_;  // the step's normalisers so far (undefined: none given)
  double flops_ = 0;
  int64_t tokens_ = 0;
  int64_t micro_batches_ = 0;
};

}  // namespace fsdp::train
