// EAGLE3's metric sums (docs/reference.md §5): per-TTT-step sums of a micro-batch's
// model::StepOutput in one float64 row, and the metrics they give once added over micro-batches
// and all-reduced over ranks (numerators and denominators, never averages of averages).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"
#include "train/algo/algorithm.h"

namespace fsdp::model {
struct StepOutput;
}

namespace fsdp::algo {

class Eagle3Metrics final : public MetricSchema {
 public:
  // `aggregation`: how acc_i is formed (--accuracy-aggregation).
  Eagle3Metrics(int64_t ttt_length, config::AccuracyAggregation aggregation)
      : ttt_(ttt_length), aggregation_(aggregation) {}

  // The sums of one micro-batch, in the layout below (on the output's device).
  at::Tensor row(const model::StepOutput& out) const;

  int64_t width() const override;
  int64_t units_index() const override;
  int64_t valid_tokens_index() const override;
  // <prefix>/ploss_i, <prefix>/acc_i (i < T), <prefix>/loss (the trained objective per
  // sample), <prefix>/accept_len (engine-faithful: 1 + draft_accepted / drafts, when there was
  // a draft), <prefix>/accept_len_all_anchors (1 + accepted / anchors, when there was an
  // anchor), <prefix>/simulated_acc_len (sum_k prod_{i<=k} acc_i), <prefix>/acceptance_rate_i
  // (SpecForge's: the target's own probabilities), <prefix>/acceptance_rate_renorm_i (target_p
  // renormalised over the draft vocabulary), <prefix>/cond_acc_i (when step i-1's chains were
  // alive).
  std::vector<std::pair<std::string, double>> report(const double* v,
                                                     const std::string& prefix) const override;
  // 3T+2, 3T+4 and 7T+6 values: checkpoints written before the chain sums, the later metrics,
  // or the logged objective and SpecForge's acceptance_rate_i existed; what they lack counts as
  // none (those metrics have denominators of their own).
  std::vector<double> adopt(const std::vector<double>& saved) const override;

 private:
  // The layout: [ploss T | correct T | loss_tokens T | valid 1 | units 1 | accepted 1 |
  // anchors 1 | chain_hits T | draft_accepted 1 | drafts 1 | accept_rate_renorm T |
  // position_tokens T | sum of per-micro-batch acc T | objective 1 | units 1 | accept_rate T |
  // position_tokens T]; units: micro-batches, a packed one counting its documents.
  int64_t ttt_;
  config::AccuracyAggregation aggregation_;
};

}  // namespace fsdp::algo
