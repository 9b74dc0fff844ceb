// A DSpark draft's metric sums (train/algo/dspark_metrics.h).
#include "train/algo/dspark_metrics.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fsdp::algo {

at::Tensor DSparkMetrics::row(const at::Tensor& loss_sum, const at::Tensor& normaliser,
                              const at::Tensor& valid_tokens, const model::DSparkTerms& t,
                              const model::EngineWalk& walk) {
  const auto f64 = [](const at::Tensor& x) { return x.detach().to(at::kDouble).reshape({}); };
  const at::Tensor one = at::ones({}, loss_sum.options().dtype(at::kDouble));
  const at::Tensor sums = at::stack(
      {one, f64(valid_tokens), f64(loss_sum), f64(normaliser), f64(t.ce_num), f64(t.l1_num),
       f64(t.confidence_num), f64(t.confidence_error_num), f64(t.correct_num), f64(t.eval_den),
       f64(t.teacher_agreement_num), f64(t.teacher_top1_num), f64(t.draft_top1_num), f64(t.tau_num),
       f64(t.tau_den), t.has_target ? one : at::zeros_like(one)});
  return at::cat({sums, WalkColumns::row(walk).to(sums.device())});
}

std::vector<std::pair<std::string, double>> DSparkMetrics::report(const double* v,
                                                                  const std::string& prefix) const {
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : std::nan(""); };
  std::vector<std::pair<std::string, double>> out = {
      {prefix + "/loss", ratio(v[kLossSum], v[kLossDen])},
      {prefix + "/ce_loss", ratio(v[kCe], v[kLossDen])},
      {prefix + "/l1_loss", ratio(v[kL1], v[kLossDen])},
      {prefix + "/confidence_loss", ratio(v[kConfidence], v[kLossDen])},
      {prefix + "/confidence_abs_error", ratio(v[kConfidenceError], v[kLossDen])},
      {prefix + "/acc", ratio(v[kCorrect], v[kEvalDen])}};
  if (v[kWithTarget] > 0) {
    out.emplace_back(prefix + "/teacher_agreement", ratio(v[kTeacherAgreement], v[kEvalDen]));
    out.emplace_back(prefix + "/teacher_top1_prob", ratio(v[kTeacherTop1], v[kEvalDen]));
    out.emplace_back(prefix + "/draft_top1_prob", ratio(v[kDraftTop1], v[kEvalDen]));
    out.emplace_back(prefix + "/tau_probabilistic", ratio(v[kTauNum], v[kTauDen]));
  }
  WalkColumns::report(v + kWalk, prefix, out);
  return out;
}

std::vector<double> DSparkMetrics::adopt(const std::vector<double>& saved) const {
  if (static_cast<int64_t>(saved.size()) != kWidth) return {};
  return saved;
}

}  // namespace fsdp::algo
