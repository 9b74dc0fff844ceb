// The soft cross-entropy kernels (kernels/fused.h, launched by soft_ce.cu): one block per loss
// row; the row's max m and log sum_v exp(z_v - m) (online), then -sum_v p_v ((z_v - m) - log_sum)
// and sum_v p_v over the same row, all in fp32; the backward writes the logits' gradient in one
// pass. m and log_sum are kept apart, as the composite log_softmax keeps them: their fp32 sum (the
// log-sum-exp, up to ~40 for real logits) would round by up to 2e-6, and exp(z - lse) with it.
// Device code only: nvcc compiles it, and tests/unit/kernels/emulation.cpp runs it on host threads.
#pragma once

#include "kernels/device_math.cuh"

namespace fsdp::kernels::device {

constexpr int kThreads = 512;

template <class Z, class P>
__global__ void __launch_bounds__(kThreads)
    soft_ce_forward_kernel(const Z* __restrict__ logits, int64_t ldz, const P* __restrict__ target,
                           int64_t ldp, const int64_t* __restrict__ take, int64_t V,
                           float* __restrict__ loss, float* __restrict__ max_out,
                           float* __restrict__ log_sum_out, float* __restrict__ psum_out) {
  __shared__ float scratch[64];
  const int64_t r = blockIdx.x;
  const Z* z = logits + r * ldz;
  const P* p = target + take[r] * ldp;
  device::MaxSum ms;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) ms.add(to_float(z[v]));
  const device::MaxSum row = device::block_max_sum(ms, scratch);
  const float m = row.m, ls = logf(row.s);
  float pz = 0.f, ps = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float pv = to_float(p[v]);
    pz += pv * ((to_float(z[v]) - m) - ls);
    ps += pv;
  }
  device::block_sum2(pz, ps, scratch);
  if (threadIdx.x == 0) {
    loss[r] = -pz;
    max_out[r] = m;
    log_sum_out[r] = ls;
    psum_out[r] = ps;
  }
}

template <class Z, class P>
__global__ void __launch_bounds__(kThreads)
    soft_ce_backward_kernel(const float* __restrict__ grad, const Z* __restrict__ logits,
                            int64_t ldz, const P* __restrict__ target, int64_t ldp,
                            const int64_t* __restrict__ take, const float* __restrict__ row_max,
                            const float* __restrict__ log_sum, const float* __restrict__ psum,
                            int64_t V, Z* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const Z* z = logits + r * ldz;
  const P* p = target + take[r] * ldp;
  Z* o = out + r * V;
  const float g = grad[r], m = row_max[r], ls = log_sum[r], gs = g * psum[r];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    o[v] = from_float<Z>(expf((to_float(z[v]) - m) - ls) * gs - g * to_float(p[v]));
}

}  // namespace fsdp::kernels::device
