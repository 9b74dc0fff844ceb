// fsdp-train's own CUDA kernels for the step's memory-bound tails (docs/model.md "Fused CUDA
// kernels"): the soft cross-entropy over the draft vocabulary with its backward, and the TTT
// attention's diagonal merge with its backward. LibTorch in, LibTorch out; each function checks
// shapes, dtypes and devices and throws fsdp::Error naming what is wrong. The model decides when
// to call them (`--fused-cuda-kernels`); the composite ops stay the definition they are tested
// against. This file and fused.cpp are the only ones that know whether the kernels were built.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::kernels {

// True in a CUDA build (the kernels are compiled in for FSDP_CUDA_ARCHITECTURES).
bool compiled();

// --- soft cross-entropy: loss[r] = -sum_v p_v log_softmax(z_r)_v, p = target_p[take[r]] ---
// logits [N, V] and target_p [M, V] on one CUDA device, fp32/bf16/fp16, rows contiguous;
// take int64 [N] indexing target_p's rows. False (the caller runs the composite ops) otherwise.
bool soft_ce_supported(const at::Tensor& logits, const at::Tensor& target_p);
struct SoftCe {
  at::Tensor loss;     // fp32 [N]
  at::Tensor row_max;  // fp32 [N]: each row's max m (for the backward)
  at::Tensor log_sum;  // fp32 [N]: log sum_v exp(z_v - m) (log-sum-exp = m + log_sum)
  at::Tensor psum;     // fp32 [N]: sum_v p_v of each row (for the backward)
};
SoftCe soft_ce_forward(const at::Tensor& logits, const at::Tensor& target_p,
                       const at::Tensor& take);
// d loss / d logits scaled by grad [N]: grad_r (softmax(z_r) psum_r - p_r), in the logits' dtype.
at::Tensor soft_ce_backward(const at::Tensor& grad, const at::Tensor& logits,
                            const at::Tensor& target_p, const at::Tensor& take,
                            const at::Tensor& row_max, const at::Tensor& log_sum,
                            const at::Tensor& psum);

// --- the TTT attention's diagonal merge (model/ttt_attention.cpp) ---
// q [B, nh, S, d] on a CUDA device, fp32/bf16/fp16, d <= 256, and `steps` diagonal keys within
// the backward's shared memory (launch.h). False (composite ops) otherwise.
bool ttt_merge_supported(const at::Tensor& q, int64_t steps);
struct Merge {
  at::Tensor out;    // [B, nh, S, d] in q's dtype
  at::Tensor total;  // fp32 [B, nh, S]: the merged log-sum-exp
};
// causal_out [B, nh, S, d] and lse_c [B, nh, S] (any float dtype) from the causal kernel; kd, vd
// [B, nkv, S, steps, d] in q's dtype.
Merge ttt_merge_forward(const at::Tensor& q, const at::Tensor& causal_out, const at::Tensor& lse_c,
                        const at::Tensor& kd, const at::Tensor& vd, double scale);
struct MergeGrads {
  at::Tensor dq;        // dq_causal plus the diagonal keys' part, q's dtype
  at::Tensor dkd, dvd;  // [B, nkv, S, steps, d]
};
MergeGrads ttt_merge_backward(const at::Tensor& q, const at::Tensor& grad, const at::Tensor& out,
                              const at::Tensor& total, const at::Tensor& kd, const at::Tensor& vd,
                              const at::Tensor& dq_causal, double scale);

}  // namespace fsdp::kernels
