// Launchers of the soft cross-entropy kernels (soft_ce.cuh) for every pair of logits and target
// dtypes (fp32, bf16, fp16). Never allocates; no LibTorch.
#include "kernels/soft_ce.cuh"

namespace fsdp::kernels {
namespace {

using device::kThreads;
using device::soft_ce_backward_kernel;
using device::soft_ce_forward_kernel;

// Every (logits, target) pair of fp32, bf16 and fp16: f(Z{}, P{}).
template <class F>
const char* with_types(launch::Dtype dz, launch::Dtype dp, F&& f) {
  return device::with_storage_type(dz, [&](auto z0) {
    return device::with_storage_type(dp, [&](auto p0) { return f(z0, p0); });
  });
}

}  // namespace

namespace launch {

const char* soft_ce_forward(Dtype dz, const void* logits, int64_t ldz, Dtype dp, const void* target,
                            int64_t ldp, const int64_t* take, int64_t n, int64_t V, float* loss,
                            float* row_max, float* log_sum, float* psum, void* stream) {
  if (n == 0) return nullptr;
  return with_types(dz, dp, [&](auto z0, auto p0) -> const char* {
    using Z = decltype(z0);
    using P = decltype(p0);
    soft_ce_forward_kernel<Z, P>
        <<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const Z*>(logits), ldz, static_cast<const P*>(target), ldp, take, V, loss,
            row_max, log_sum, psum);
    return device::error_text();
  });
}

const char* soft_ce_backward(const float* grad, Dtype dz, const void* logits, int64_t ldz, Dtype dp,
                             const void* target, int64_t ldp, const int64_t* take,
                             const float* row_max, const float* log_sum, const float* psum,
                             int64_t n, int64_t V, void* grad_logits, void* stream) {
  if (n == 0) return nullptr;
  return with_types(dz, dp, [&](auto z0, auto p0) -> const char* {
    using Z = decltype(z0);
    using P = decltype(p0);
    soft_ce_backward_kernel<Z, P>
        <<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            grad, static_cast<const Z*>(logits), ldz, static_cast<const P*>(target), ldp, take,
            row_max, log_sum, psum, V, static_cast<Z*>(grad_logits));
    return device::error_text();
  });
}

}  // namespace launch
}  // namespace fsdp::kernels
