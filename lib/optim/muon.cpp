// Muon on whole matrices (optim/muon.h).
#include "optim/muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fsdp::optim {

void MuonOptions::validate() const {
  FSDP_USAGE_CHECK(momentum >= 0 && momentum < 1, fsdp::str("--muon-momentum ", momentum),
                   "give a momentum in [0, 1), e.g. 0.95");
  FSDP_USAGE_CHECK(weight_decay >= 0, fsdp::str("--muon-weight-decay ", weight_decay),
                   "give a weight decay >= 0, e.g. 0.1");
  FSDP_USAGE_CHECK(ns_steps >= 1 && ns_steps < 100, fsdp::str("--muon-ns-steps ", ns_steps),
                   "give 1..99 Newton-Schulz steps (torch.optim.Muon refuses 100 or more), e.g. 5");
  FSDP_USAGE_CHECK(eps > 0, fsdp::str("Muon eps ", eps), "give a positive eps, e.g. 1e-7");
}

at::Tensor newton_schulz(const at::Tensor& matrix, const std::array<double, 3>& coefficients,
                         int64_t steps, double eps, bool fp32) {
  FSDP_CHECK(matrix.dim() == 2, fsdp::str("Newton-Schulz of a ", matrix.dim(), "-D tensor"),
             "Muon orthogonalises 2-D matrices only");
  const auto [a, b, c] = coefficients;
  const bool tall = matrix.size(0) > matrix.size(1);
  at::Tensor x = matrix.to(fp32 ? at::kFloat : at::kBFloat16);
  if (tall) x = x.t();
  x = x.div(x.norm().clamp_min(eps));
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor gram = at::matmul(x, x.t());
    const at::Tensor update = at::addmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = at::addmm(x, update, x, /*beta=*/a);
  }
  return tall ? x.t() : x;
}

double muon_adjusted_lr(double lr, MuonAdjustLr adjust, int64_t rows, int64_t cols) {
  const auto r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (adjust == MuonAdjustLr::kOriginal) return lr * std::sqrt(std::max(1.0, r / c));
  return lr * 0.2 * std::sqrt(std::max(r, c));
}

void muon_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum_buffer,
                 double lr, const MuonOptions& o) {
  FSDP_CHECK(
      param.dim() == 2 && grad.sizes() == param.sizes() && momentum_buffer.sizes() == param.sizes(),
      fsdp::str("muon_update: param ", param.sizes(), ", grad ", grad.sizes(), ", buffer ",
                momentum_buffer.sizes()),
      "pass one whole matrix and its gradient and momentum");
  at::NoGradGuard guard;
  momentum_buffer.lerp_(grad, 1 - o.momentum);
  const at::Tensor update = o.nesterov ? grad.lerp(momentum_buffer, o.momentum) : momentum_buffer;
  const at::Tensor ortho = newton_schulz(update, o.ns_coefficients, o.ns_steps, o.eps, o.ns_fp32);
  const double adjusted = muon_adjusted_lr(lr, o.adjust_lr, param.size(0), param.size(1));
  param.mul_(1 - lr * o.weight_decay);
  param.add_(ortho, -adjusted);
}

MuonGroup muon_group(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || std::min(shape[0], shape[1]) == 1) return MuonGroup::kAdamW;
  for (const char* hint : {"embed_tokens", "lm_head", "codebook", "markov_w1", "markov_w2"})
    if (name.find(hint) != std::string::npos) return MuonGroup::kAdamWAtMuonLr;
  return MuonGroup::kMuon;
}

}  // namespace fsdp::optim
