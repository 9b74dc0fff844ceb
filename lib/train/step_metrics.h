// Metric accumulation between log points: per-TTT-step sums from model::StepOutput across
// micro-batches, reduced exactly over all ranks (numerators and denominators all-reduced, not
// averages of averages) into named scalars. Keeps tensors on the device until report() so the
// step itself never synchronises the host.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"

namespace fsdp::comm {
class Communicator;
}
namespace fsdp::model {
struct StepOutput;
}

namespace fsdp::train {

class StepMetrics {
 public:
  // `device`: where report()'s buffer lives when nothing was added (the metrics
  // communicator's device: NCCL reduces device tensors only). `aggregation`: how report()
  // forms acc_i (config::AccuracyAggregation; --accuracy-aggregation).
  explicit StepMetrics(
      int64_t ttt_length, c10::Device device = c10::Device(c10::kCPU),
      config::AccuracyAggregation aggregation = config::AccuracyAggregation::kPooled)
      : ttt_(ttt_length), device_(device), aggregation_(aggregation) {}
  void add(const model::StepOutput& out);
  bool empty() const { return micro_batches_ == 0; }
  // All-reduces the sums over `comm` (every rank must call) and returns, as
  // docs/reference.md §5 defines them: <prefix>/ploss_i, <prefix>/acc_i (i < T), <prefix>/loss
  // (the trained objective per sample: the sum of StepOutput::objective over the sum of units),
  // <prefix>/accept_len (engine-faithful: 1 + draft_accepted / drafts, when there was a draft),
  // <prefix>/accept_len_all_anchors (1 + accepted / anchors, when there was an anchor),
  // <prefix>/simulated_acc_len (sum_k prod_{i<=k} acc_i), <prefix>/acceptance_rate_i
  // (SpecForge's: the target's own probabilities), <prefix>/acceptance_rate_renorm_i (target_p
  // renormalised over the draft vocabulary), <prefix>/cond_acc_i (when step i-1's chains were
  // alive), and the global number of valid tokens; then clears the sums.
  std::vector<std::pair<std::string, double>> report(comm::Communicator& comm,
                                                     const std::string& prefix,
                                                     int64_t* global_tokens = nullptr);
  void clear();
  // The sums of every rank so far, all-reduced (every rank must call; nothing is cleared): what
  // a checkpoint records so that the epoch's metrics stay exact across a resume.
  std::vector<double> global_sums(comm::Communicator& comm) const;
  // Adds such sums (a resumed checkpoint's) to this rank's: call on one rank only, since
  // report() adds up the ranks. Ignored when the length does not match this T.
  void add_sums(const std::vector<double>& sums);

 private:
  at::Tensor reduced(comm::Communicator& comm) const;  // the all-reduced buffer, on the host
  int64_t ttt_;
  c10::Device device_;
  config::AccuracyAggregation aggregation_;
  int64_t micro_batches_ = 0;
  // The sums, in the order of the all-reduced buffer (and of a checkpoint's sums):
  // [ploss T | correct T | loss_tokens T | valid 1 | units 1 | accepted 1 | anchors 1 |
  //  chain_hits T | draft_accepted 1 | drafts 1 | accept_rate_renorm T | position_tokens T |
  //  sum of per-micro-batch acc T | objective 1 | units 1 | accept_rate T | position_tokens T];
  // units: micro-batches, a packed one counting its documents (StepOutput::units). The loss and
  // SpecForge's acceptance_rate_i have denominators of their own (the second units and
  // position_tokens), so a checkpoint of an older version, which has the first 3T+2, 3T+4 or
  // 7T+6 only, leaves them counting from the resume on.
  at::Tensor sums_;
};

}  // namespace fsdp::train
