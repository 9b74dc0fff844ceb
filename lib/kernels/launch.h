// The CUDA kernels' launchers (soft_ce.cu, ttt_merge.cu): plain pointers, sizes and a stream, no
// LibTorch, so nvcc compiles them in seconds. Only fused.cpp calls them, after checking shapes,
// dtypes, devices and strides; they never allocate. Each returns null or the CUDA error's text.
#pragma once

#include <cstdint>

namespace fsdp::kernels::launch {

enum class Dtype : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Soft cross-entropy over each of n rows of V logits: loss[r] = -sum_v p_v log_softmax(z)_v, with
// p = target[take[r]], everything in fp32; also writes the row's max m[r], log_sum[r] = log
// sum_v exp(z_v - m[r]) and psum[r] = sum_v p_v, which the backward reads. Rows have stride ldz
// (logits) and ldp (target), elements stride 1.
const char* soft_ce_forward(Dtype dz, const void* logits, int64_t ldz, Dtype dp, const void* target,
                            int64_t ldp, const int64_t* take, int64_t n, int64_t V, float* loss,
                            float* row_max, float* log_sum, float* psum, void* stream);

// grad_logits[r, v] = grad[r] * (exp((z_v - m[r]) - log_sum[r]) * psum[r] - p_v), in the logits'
// dtype, rows of V contiguous elements.
const char* soft_ce_backward(const float* grad, Dtype dz, const void* logits, int64_t ldz, Dtype dp,
                             const void* target, int64_t ldp, const int64_t* take,
                             const float* row_max, const float* log_sum, const float* psum,
                             int64_t n, int64_t V, void* grad_logits, void* stream);

// Element strides of a [B, heads, S, d] tensor whose last dimension is contiguous.
struct Strides {
  int64_t b = 0, h = 0, s = 0;
};

// The TTT attention's diagonal merge (model/ttt_attention.cpp). Shapes: q, causal_out [B, nh, S,
// d] (strided), lse_c [B, nh, S] fp32 contiguous (the causal part's log-sum-exp), kd, vd [B, nkv,
// S, steps, d] contiguous, nh = nkv * groups. Writes out [B, nh, S, d] contiguous (q's dtype)
// and total [B, nh, S] fp32: the log-sum-exp over the causal keys and the steps' diagonal keys.
struct MergeShape {
  int64_t B = 0, nkv = 0, groups = 0, S = 0, steps = 0, d = 0;
};
const char* ttt_merge_forward(Dtype dt, const MergeShape& shape, const void* q, Strides sq,
                              const void* causal_out, Strides sc, const float* lse_c,
                              const void* kd, const void* vd, float scale, void* out, float* total,
                              void* stream);

// Its backward for the diagonal keys: dq_out = dq_causal + scale * sum_j ds_j kd_j (dq_out
// contiguous), dkd = scale * sum_g ds q, dvd = sum_g p go, with p_j = exp(scale q.kd_j - total),
// ds_j = p_j (go.vd_j - go.out). grad, out and dq_causal are strided [B, nh, S, d].
const char* ttt_merge_backward(Dtype dt, const MergeShape& shape, const void* q, Strides sq,
                               const void* grad, Strides sg, const void* out, Strides so,
                               const float* total, const void* kd, const void* vd,
                               const void* dq_causal, Strides sdq, float scale, void* dq_out,
                               void* dkd, void* dvd, void* stream);

// The merge kernels' limits: head size, and the backward's shared memory (a block of
// kMergeWarpsPerBlock warps, each with 2 x steps x d floats, within the 48 KiB every GPU gives
// without opting in: steps x d <= 1536, e.g. 12 steps at d = 128). fused.cpp's callers fall back
// to the composite ops outside them.
constexpr int64_t kMergeMaxHeadDim = 256;
constexpr int64_t kMergeWarpsPerBlock = 4;
constexpr int64_t kMergeMaxSharedBytes = 48 * 1024;
inline int64_t merge_shared_bytes_per_warp(int64_t steps, int64_t d) {
  return 2 * steps * d * static_cast<int64_t>(sizeof(float));
}

}  // namespace fsdp::kernels::launch
