// The TTT attention's diagonal-merge kernels (kernels/fused.h, launched by ttt_merge.cu): one
// warp per (sample, kv head, position) handles the `groups` query heads that share the kv head.
// Forward: the steps' diagonal scores, their log-sum-exp merged with the causal part's, the
// merged output. Backward: D = go.out, each step's probability and ds, dq += scale * sum_j ds_j
// kd_j per head, and the kv head's dkd / dvd summed over its query heads in fp32 (shared memory,
// one slice per warp, each lane owning its own elements). All arithmetic in fp32. Device code
// only: nvcc compiles it, and tests/unit/kernels/emulation.cpp runs it on host threads.
#pragma once

#include "kernels/device_math.cuh"

namespace fsdp::kernels::device {

using launch::MergeShape;
using launch::Strides;

constexpr int kPerLane = static_cast<int>(launch::kMergeMaxHeadDim / 32);
constexpr int kWarpsPerBlock = static_cast<int>(launch::kMergeWarpsPerBlock);

// This lane's elements e = lane + 32 k (k < kPerLane, e < d) of one head row, as fp32 (0 past d).
template <class T>
__device__ __forceinline__ void load_row(const T* row, int64_t d, int lane, float (&x)[kPerLane]) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t e = lane + 32 * k;
    x[k] = e < d ? to_float(row[e]) : 0.f;
  }
}

__device__ __forceinline__ float dot(const float (&a)[kPerLane], const float (&b)[kPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) s += a[k] * b[k];
  return warp_sum(s);
}

// log(exp(a) + exp(b)), as at::logaddexp.
__device__ __forceinline__ float log_add_exp(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const float m = fmaxf(a, b);
  return m + log1pf(expf(-fabsf(a - b)));
}

struct Item {
  int64_t b, kh, s, kv_row;  // kv_row: offset of kd[b, kh, s, 0, 0]
};

__device__ __forceinline__ bool item_of(const MergeShape& sh, Item& it) {
  const int64_t warp = threadIdx.x >> 5;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (item >= sh.B * sh.nkv * sh.S) return false;
  it.s = item % sh.S;
  const int64_t bk = item / sh.S;
  it.kh = bk % sh.nkv;
  it.b = bk / sh.nkv;
  it.kv_row = (bk * sh.S + it.s) * sh.steps * sh.d;
  return true;
}

template <class T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    merge_forward_kernel(MergeShape sh, const T* __restrict__ q, Strides sq,
                         const T* __restrict__ cout, Strides sc, const float* __restrict__ lse_c,
                         const T* __restrict__ kd, const T* __restrict__ vd, float scale,
                         T* __restrict__ out, float* __restrict__ total) {
  Item it;
  if (!item_of(sh, it)) return;  // the whole warp leaves together
  const int lane = threadIdx.x & 31;
  const int64_t nh = sh.nkv * sh.groups, d = sh.d;
  float qv[kPerLane], kj[kPerLane], acc[kPerLane];
  for (int64_t g = 0; g < sh.groups; ++g) {
    const int64_t h = it.kh * sh.groups + g;
    const int64_t row = (it.b * nh + h) * sh.S + it.s;  // [B, nh, S] index
    load_row(q + it.b * sq.b + h * sq.h + it.s * sq.s, d, lane, qv);
    device::MaxSum diag;
    for (int64_t j = 0; j < sh.steps; ++j) {
      load_row(kd + it.kv_row + j * d, d, lane, kj);
      diag.add(dot(qv, kj) * scale);
    }
    const float lc = lse_c[row];
    const float tot = log_add_exp(lc, diag.lse());
    const float wc = expf(lc - tot);
    load_row(cout + it.b * sc.b + h * sc.h + it.s * sc.s, d, lane, acc);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) acc[k] *= wc;
    for (int64_t j = 0; j < sh.steps; ++j) {
      load_row(kd + it.kv_row + j * d, d, lane, kj);
      const float pj = expf(dot(qv, kj) * scale - tot);
      load_row(vd + it.kv_row + j * d, d, lane, kj);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) acc[k] += pj * kj[k];
    }
    T* o = out + row * d;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t e = lane + 32 * k;
      if (e < d) o[e] = from_float<T>(acc[k]);
    }
    if (lane == 0) total[row] = tot;
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    merge_backward_kernel(MergeShape sh, const T* __restrict__ q, Strides sq,
                          const T* __restrict__ grad, Strides sg, const T* __restrict__ out,
                          Strides so, const float* __restrict__ total, const T* __restrict__ kd,
                          const T* __restrict__ vd, const T* __restrict__ dq_in, Strides sdq,
                          float scale, T* __restrict__ dq_out, T* __restrict__ dkd,
                          T* __restrict__ dvd) {
  FSDP_DYNAMIC_SHARED(float, smem);
  Item it;
  if (!item_of(sh, it)) return;
  const int lane = threadIdx.x & 31;
  const int64_t nh = sh.nkv * sh.groups, d = sh.d, steps = sh.steps;
  // This warp's fp32 sums over the query heads: dk then dv, [steps, d] each. A lane reads and
  // writes only its own elements, so no synchronisation is needed.
  float* adk = smem + (threadIdx.x >> 5) * 2 * steps * d;
  float* adv = adk + steps * d;
  for (int64_t x = lane; x < 2 * steps * d; x += 32) adk[x] = 0.f;
  __syncwarp();
  float qv[kPerLane], gv[kPerLane], kj[kPerLane], vj[kPerLane], dqd[kPerLane];
  for (int64_t g = 0; g < sh.groups; ++g) {
    const int64_t h = it.kh * sh.groups + g;
    const int64_t row = (it.b * nh + h) * sh.S + it.s;
    load_row(q + it.b * sq.b + h * sq.h + it.s * sq.s, d, lane, qv);
    load_row(grad + it.b * sg.b + h * sg.h + it.s * sg.s, d, lane, gv);
    load_row(out + it.b * so.b + h * so.h + it.s * so.s, d, lane, kj);
    const float D = dot(gv, kj);
    const float tot = total[row];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) dqd[k] = 0.f;
    for (int64_t j = 0; j < steps; ++j) {
      load_row(kd + it.kv_row + j * d, d, lane, kj);
      load_row(vd + it.kv_row + j * d, d, lane, vj);
      const float pj = expf(dot(qv, kj) * scale - tot);
      const float ds = pj * (dot(gv, vj) - D);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t e = lane + 32 * k;
        dqd[k] += ds * kj[k];
        if (e < d) {
          adk[j * d + e] += ds * qv[k];
          adv[j * d + e] += pj * gv[k];
        }
      }
    }
    load_row(dq_in + it.b * sdq.b + h * sdq.h + it.s * sdq.s, d, lane, kj);
    T* o = dq_out + row * d;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t e = lane + 32 * k;
      if (e < d) o[e] = from_float<T>(kj[k] + dqd[k] * scale);
    }
  }
  for (int64_t j = 0; j < steps; ++j) {
    for (int64_t e = lane; e < d; e += 32) {
      dkd[it.kv_row + j * d + e] = from_float<T>(adk[j * d + e] * scale);
      dvd[it.kv_row + j * d + e] = from_float<T>(adv[j * d + e]);
    }
  }
}

}  // namespace fsdp::kernels::device
