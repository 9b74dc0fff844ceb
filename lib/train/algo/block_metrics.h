// A block draft's metric sums (DFlash; docs/block-drafts.md): one float64 row per
// micro-batch, added over micro-batches and all-reduced over ranks, and the metrics they give;
// and the engine walk's columns, which end both block families' rows (DSpark's too).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/block_acceptance.h"
#include "model/dflash_objective.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

// The engine's walk over the replies (model/block_acceptance.h) as metric columns: accepted
// tokens, drafts, rows walked, rows not walked (all 0 while training, which walks nothing).
struct WalkColumns {
  static constexpr int64_t kWidth = 4;
  static at::Tensor row(const model::EngineWalk& walk);  // float64 [kWidth] on the host
  // From the columns at v: <prefix>/accept_len (1 + accepted tokens over drafts) when some reply
  // was walked, and <prefix>/rows_not_walked (rows whose replies reach an anchor that was not
  // sampled) when some row was walked or left out, i.e. in evaluation.
  static void report(const double* v, const std::string& prefix,
                     std::vector<std::pair<std::string, double>>& out);
};

class BlockMetrics final : public MetricSchema {
 public:
  // The row of one micro-batch: its loss as a sum and that sum's normaliser, `valid_tokens` its
  // attention tokens, `terms` its objective's sums, `walk` the engine's drafts over its replies
  // (evaluation; none while training).
  static at::Tensor row(const at::Tensor& loss_sum, const at::Tensor& normaliser,
                        const at::Tensor& valid_tokens, const model::DFlashTerms& terms,
                        const model::EngineWalk& walk);

  int64_t width() const override { return kWidth; }
  int64_t units_index() const override { return kUnits; }
  int64_t valid_tokens_index() const override { return kValid; }
  // <prefix>/loss (the loss sums over their normalisers), <prefix>/acc (supervised block
  // positions predicted right), <prefix>/accept_len_all_anchors (1 + the leading run of right
  // predictions per block, over every sampled block), <prefix>/blocks (blocks per micro-batch),
  // and WalkColumns' accept_len and rows_not_walked.
  std::vector<std::pair<std::string, double>> report(const double* v,
                                                     const std::string& prefix) const override;
  std::vector<double> adopt(const std::vector<double>& saved) const override;

 private:
  enum : int64_t {
    kUnits,
    kValid,
    kLossSum,
    kLossDen,
    kCorrect,
    kAccDen,
    kAcceptNum,
    kAcceptDen,
    kWalk,
    kWidth = kWalk + WalkColumns::kWidth
  };
};

}  // namespace fsdp::algo
