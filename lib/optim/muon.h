// Muon on whole matrices (the engine's sharded step, shard/muon_shard.h, builds on it): the
// exact arithmetic of torch.optim.Muon 2.11 (Nesterov momentum by lerp, the Newton-Schulz
// quintic in bfloat16, the learning-rate adjustment, decoupled weight decay with the unadjusted
// learning rate), and speculators' rule for which parameters Muon takes. Knows nothing about
// sharding: the engine hands it one gathered matrix at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::optim {

// torch.optim.Muon's adjust_lr_fn: "original" scales the learning rate by
// sqrt(max(1, rows / cols)); "match_rms_adamw" by 0.2 * sqrt(max(rows, cols)) (the update's RMS
// then matches AdamW's).
enum class MuonAdjustLr { kOriginal, kMatchRmsAdamW };

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  double weight_decay = 0.1;
  int64_t ns_steps = 5;
  std::array<double, 3> ns_coefficients{3.4445, -4.7750, 2.0315};
  double eps = 1e-7;
  MuonAdjustLr adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
  // Tests only: the Newton-Schulz in fp32 instead of torch's bf16, so that a sharded run can be
  // compared with the whole-model reference without bf16 rounding last-bit gradient differences.
  bool ns_fp32 = false;

  // Throws fsdp::UsageError naming the option when out of range (torch.optim.Muon's checks).
  void validate() const;
};

// The Newton-Schulz orthogonalisation of a 2-D matrix as torch.optim.Muon computes it: in
// bfloat16, transposed when it has more rows than columns, divided by max(its Frobenius norm,
// eps), then ns_steps of X <- a X + (b A + c A A) X with A = X X^T. Returns bfloat16 [rows, cols]
// (fp32 with `fp32`, MuonOptions::ns_fp32).
at::Tensor newton_schulz(const at::Tensor& matrix, const std::array<double, 3>& coefficients,
                         int64_t steps, double eps, bool fp32 = false);

// lr times the adjustment of `adjust` for a [rows, cols] matrix.
double muon_adjusted_lr(double lr, MuonAdjustLr adjust, int64_t rows, int64_t cols);

// One torch.optim.Muon step of a whole matrix in place: buf = lerp(buf, grad, 1 - momentum);
// update = lerp(grad, buf, momentum) with Nesterov, else buf; O = newton_schulz(update);
// param *= 1 - lr * weight_decay; param -= adjusted_lr * O. param, grad, momentum_buffer: 2-D,
// same shape, float (fp32 masters), same device.
void muon_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum_buffer,
                 double lr, const MuonOptions& options);

// Which optimizer a trainable parameter gets under --optimizer muon, speculators' rule
// (src/speculators/train/optimizers.py, split_named_params_for_muon): Muon for a 2-D matrix with
// both dimensions > 1 whose name holds none of embed_tokens, lm_head, codebook, markov_w1,
// markov_w2; AdamW at Muon's learning rate and weight decay for such a named matrix (kept out of
// Muon for its shape, not to train more slowly); AdamW at the base settings for everything else
// (norms, biases, [1, N] and [N, 1] weights).
enum class MuonGroup { kMuon, kAdamW, kAdamWAtMuonLr };
MuonGroup muon_group(const std::string& name, const std::vector<int64_t>& shape);

}  // namespace fsdp::optim
