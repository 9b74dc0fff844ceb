// P-EAGLE's metric sums (docs/model.md "P-EAGLE"): per micro-batch one float64 row, added over
// micro-batches and all-reduced over ranks, read as SpecForge's P-EAGLE metrics and the engine's
// acceptance length under parallel drafting.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/peagle_acceptance.h"
#include "model/peagle_step.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

class PEagleMetrics final : public MetricSchema {
 public:
  explicit PEagleMetrics(int64_t depths) : depths_(depths) {}

  // The sums of one micro-batch (on the output's device): samples, valid tokens, the step's
  // per-sample losses, per-depth weighted rows and hits, and the engine walk (evaluation).
  at::Tensor row(const model::PEagleStepOutput& out, const at::Tensor& valid_tokens,
                 const model::PEagleWalk& walk) const;

  int64_t width() const override { return 5 + 2 * depths_; }
  int64_t units_index() const override { return 0; }
  int64_t valid_tokens_index() const override { return 1; }
  // <prefix>/loss (the mean over samples of each sample's weighted soft cross-entropy),
  // <prefix>/acc (every depth's rows pooled), <prefix>/position_<d>_acc (d < K, SpecForge's
  // names; absent at a depth no row reached), <prefix>/accept_len (1 + accepted / drafts of the
  // engine walk, evaluation only, when a draft was made).
  std::vector<std::pair<std::string, double>> report(const double* v,
                                                     const std::string& prefix) const override;
  std::vector<double> adopt(const std::vector<double>& saved) const override;

 private:
  // [samples | valid | loss sum | accepted | drafts | rows K | hits K]
  int64_t depths_;
};

}  // namespace fsdp::algo
