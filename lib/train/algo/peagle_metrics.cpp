// P-EAGLE's metric sums (train/algo/peagle_metrics.h).
#include "train/algo/peagle_metrics.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fsdp::algo {

at::Tensor PEagleMetrics::row(const model::PEagleStepOutput& out, const at::Tensor& valid_tokens,
                              const model::PEagleWalk& walk) const {
  const auto opts = out.depth_total.options();
  const at::Tensor head = at::tensor(
      {static_cast<double>(out.sample_loss.size(0)), 0.0, 0.0, walk.accepted, walk.drafts},
      at::TensorOptions().dtype(at::kDouble));
  at::Tensor r = at::cat({head.to(opts.device()), out.depth_total, out.depth_correct});
  r[1] = valid_tokens.to(at::kDouble).reshape({});
  r[2] = out.sample_loss.sum();
  return r;
}

std::vector<double> PEagleMetrics::adopt(const std::vector<double>& saved) const {
  if (static_cast<int64_t>(saved.size()) != width() || saved[0] <= 0) return {};
  return saved;
}

std::vector<std::pair<std::string, double>> PEagleMetrics::report(const double* v,
                                                                  const std::string& prefix) const {
  std::vector<std::pair<std::string, double>> out;
  const double samples = v[0];
  out.emplace_back(prefix + "/loss", samples > 0 ? v[2] / samples : std::nan(""));
  double rows = 0, hits = 0;
  for (int64_t d = 0; d < depths_; ++d) {
    const double n = v[5 + d], h = v[5 + depths_ + d];
    rows += n;
    hits += h;
    if (n > 0) out.emplace_back(prefix + "/position_" + std::to_string(d) + "_acc", h / n);
  }
  if (rows > 0) out.emplace_back(prefix + "/acc", hits / rows);
  if (v[4] > 0) out.emplace_back(prefix + "/accept_len", 1.0 + v[3] / v[4]);
  return out;
}

}  // namespace fsdp::algo
