// Launchers of the soft cross-entropy kernels (soft_ce.cuh) for every pair of logits and target
// dtypes (fp32, bf16, fp16). Never allocates; no LibTorch.
#include "kernels/soft_ce.cuh"

namespace fsdp::kernels {
namespace {

using device::kThreads;
using device::soft_ce_backward_kernel;
using device::soft_ce_forward_kernel;

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
