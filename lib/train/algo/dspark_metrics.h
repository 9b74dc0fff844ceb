// A DSpark draft's metric sums (docs/block-drafts.md "DSpark"): one float64 row per micro-batch,
// added over micro-batches and all-reduced over ranks, and the metrics SpecForge 0.2.0 logs for
// DSpark as ratios of those sums, then the engine walk's columns (train/algo/block_metrics.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "model/block_acceptance.h"
#include "model/dspark_objective.h"
#include "train/algo/algorithm.h"
#include "train/algo/block_metrics.h"

namespace fsdp::algo {

class DSparkMetrics final : public MetricSchema {
 public:
  // The row of one micro-batch: its loss as a sum (the alpha-weighted terms) and that sum's
  // normaliser (the loss weights' sum), `valid_tokens` its attention tokens, `terms` its
  // objective's sums, `walk` the engine's drafts over its replies (evaluation; none while
  // training).
  static at::Tensor row(const at::Tensor& loss_sum, const at::Tensor& normaliser,
                        const at::Tensor& valid_tokens, const model::DSparkTerms& terms,
                        const model::EngineWalk& walk);

  int64_t width() const override { return kWidth; }
  int64_t units_index() const override { return kUnits; }
  int64_t valid_tokens_index() const override { return kValid; }
  // <prefix>/loss (the loss sums over their normalisers); ce_loss, l1_loss, confidence_loss and
  // confidence_abs_error (each term over the loss weights' sum); acc (scored block positions
  // predicted right); and, when the target's states were read, teacher_agreement (the draft's
  // argmax is the target's), teacher_top1_prob, draft_top1_prob (mean top probabilities) and
  // tau_probabilistic (the expected accepted length of a block from the draft's and target's
  // distributions, SpecForge's tau); and WalkColumns' accept_len (the engine's greedy drafts
  // walked over the replies) and rows_not_walked, in evaluation.
  std::vector<std::pair<std::string, double>> report(const double* v,
                                                     const std::string& prefix) const override;
  std::vector<double> adopt(const std::vector<double>& saved) const override;

 private:
  enum : int64_t {
    kUnits,
    kValid,
    kLossSum,
    kLossDen,
    kCe,
    kL1,
    kConfidence,
    kConfidenceError,
    kCorrect,
    kEvalDen,
    kTeacherAgreement,
    kTeacherTop1,
    kDraftTop1,
    kTauNum,
    kTauDen,
    kWithTarget,
    kWalk,
    kWidth = kWalk + WalkColumns::kWidth
  };
};

}  // namespace fsdp::algo
