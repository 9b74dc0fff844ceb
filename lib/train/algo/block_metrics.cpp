// A block draft's metric sums (train/algo/block_metrics.h).
#include "train/algo/block_metrics.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fsdp::algo {

at::Tensor WalkColumns::row(const model::EngineWalk& walk) {
  return at::tensor({walk.accepted, walk.drafts, static_cast<double>(walk.rows_walked),
                     static_cast<double>(walk.rows_incomplete)},
                    at::kDouble);
}

void WalkColumns::report(const double* v, const std::string& prefix,
                         std::vector<std::pair<std::string, double>>& out) {
  const double accepted = v[0], drafts = v[1], walked = v[2], incomplete = v[3];
  if (drafts > 0) out.emplace_back(prefix + "/accept_len", 1.0 + accepted / drafts);
  if (walked + incomplete > 0) out.emplace_back(prefix + "/rows_not_walked", incomplete);
}

at::Tensor BlockMetrics::row(const at::Tensor& loss_sum, const at::Tensor& normaliser,
                             const at::Tensor& valid_tokens, const model::DFlashTerms& t,
                             const model::EngineWalk& walk) {
  const auto f64 = [](const at::Tensor& x) { return x.detach().to(at::kDouble).reshape({}); };
  const at::Tensor sums = at::stack(
      {at::ones({}, loss_sum.options().dtype(at::kDouble)), f64(valid_tokens), f64(loss_sum),
       f64(normaliser), f64(t.correct), f64(t.accuracy_den), f64(t.accept_num), f64(t.accept_den)});
  return at::cat({sums, WalkColumns::row(walk).to(sums.device())});
}

std::vector<std::pair<std::string, double>> BlockMetrics::report(const double* v,
                                                                 const std::string& prefix) const {
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : std::nan(""); };
  std::vector<std::pair<std::string, double>> out = {
      {prefix + "/loss", ratio(v[kLossSum], v[kLossDen])},
      {prefix + "/acc", ratio(v[kCorrect], v[kAccDen])}};
  out.emplace_back(prefix + "/accept_len_all_anchors", ratio(v[kAcceptNum], v[kAcceptDen]));
  out.emplace_back(prefix + "/blocks", ratio(v[kAcceptDen], v[kUnits]));
  WalkColumns::report(v + kWalk, prefix, out);
  return out;
}

std::vector<double> BlockMetrics::adopt(const std::vector<double>& saved) const {
  if (static_cast<int64_t>(saved.size()) != kWidth) return {};
  return saved;
}

}  // namespace fsdp::algo
