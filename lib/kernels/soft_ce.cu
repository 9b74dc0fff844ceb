// Fused soft cross-entropy over the draft vocabulary (kernels/fused.h): one block per loss row
// computes the row's log-sum-exp (online max and sum), then -sum_v p_v (z_v - lse) and sum_v p_v
// in a second pass over the same row (L2-resident), all in fp32; the backward writes the
// logits' gradient in one pass from the saved log-sum-exp. Never allocates; no LibTorch.
#include "kernels/device_math.cuh"

namespace fsdp::kernels {
namespace {

using device::from_float;
using device::to_float;

constexpr int kThreads = 512;

template <class Z, class P>
__global__ void __launch_bounds__(kThreads)
    soft_ce_forward_kernel(const Z* __restrict__ logits, int64_t ldz, const P* __restrict__ target,
                           int64_t ldp, const int64_t* __restrict__ take, int64_t V,
                           float* __restrict__ loss, float* __restrict__ lse_out,
                           float* __restrict__ psum_out) {
  __shared__ float scratch[64];
  const int64_t r = blockIdx.x;
  const Z* z = logits + r * ldz;
  const P* p = target + take[r] * ldp;
  device::MaxSum ms;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) ms.add(to_float(z[v]));
  const float lse = device::block_max_sum(ms, scratch).lse();
  float pz = 0.f, ps = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float pv = to_float(p[v]);
    pz += pv * (to_float(z[v]) - lse);
    ps += pv;
  }
  device::block_sum2(pz, ps, scratch);
  if (threadIdx.x == 0) {
    loss[r] = -pz;
    lse_out[r] = lse;
    psum_out[r] = ps;
  }
}

template <class Z, class P>
__global__ void __launch_bounds__(kThreads)
    soft_ce_backward_kernel(const float* __restrict__ grad, const Z* __restrict__ logits,
                            int64_t ldz, const P* __restrict__ target, int64_t ldp,
                            const int64_t* __restrict__ take, const float* __restrict__ lse,
                            const float* __restrict__ psum, int64_t V, Z* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const Z* z = logits + r * ldz;
  const P* p = target + take[r] * ldp;
  Z* o = out + r * V;
  const float g = grad[r], l = lse[r], gs = g * psum[r];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    o[v] = from_float<Z>(expf(to_float(z[v]) - l) * gs - g * to_float(p[v]));
}

template <class F>
const char* with_types(launch::Dtype dz, launch::Dtype dp, F&& f) {
  // Every (logits, target) pair of fp32, bf16 and fp16.
  auto by_p = [&](auto zero_z) -> const char* {
    using Z = decltype(zero_z);
    switch (dp) {
      case launch::Dtype::kFloat32:
        return f(Z{}, float{});
      case launch::Dtype::kBFloat16:
        return f(Z{}, __nv_bfloat16{});
      case launch::Dtype::kFloat16:
        return f(Z{}, __half{});
    }
    return "soft_ce: unknown target dtype";
  };
  switch (dz) {
    case launch::Dtype::kFloat32:
      return by_p(float{});
    case launch::Dtype::kBFloat16:
      return by_p(__nv_bfloat16{});
    case launch::Dtype::kFloat16:
      return by_p(__half{});
  }
  return "soft_ce: unknown logits dtype";
}

}  // namespace

namespace launch {

const char* soft_ce_forward(Dtype dz, const void* logits, int64_t ldz, Dtype dp, const void* target,
                            int64_t ldp, const int64_t* take, int64_t n, int64_t V, float* loss,
                            float* lse, float* psum, void* stream) {
  if (n == 0) return nullptr;
  return with_types(dz, dp, [&](auto z0, auto p0) -> const char* {
    using Z = decltype(z0);
    using P = decltype(p0);
    soft_ce_forward_kernel<Z, P>
        <<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const Z*>(logits), ldz, static_cast<const P*>(target), ldp, take, V, loss,
            lse, psum);
    return device::error_text();
  });
}

const char* soft_ce_backward(const float* grad, Dtype dz, const void* logits, int64_t ldz, Dtype dp,
                             const void* target, int64_t ldp, const int64_t* take, const float* lse,
                             const float* psum, int64_t n, int64_t V, void* grad_logits,
                             void* stream) {
  if (n == 0) return nullptr;
  return with_types(dz, dp, [&](auto z0, auto p0) -> const char* {
    using Z = decltype(z0);
    using P = decltype(p0);
    soft_ce_backward_kernel<Z, P>
        <<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            grad, static_cast<const Z*>(logits), ldz, static_cast<const P*>(target), ldp, take, lse,
            psum, V, static_cast<Z*>(grad_logits));
    return device::error_text();
  });
}

}  // namespace launch
}  // namespace fsdp::kernels
