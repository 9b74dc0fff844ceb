// Launchers of the TTT attention's diagonal-merge kernels (ttt_merge.cuh) for fp32, bf16 and
// fp16. No LibTorch, no allocation.
#include "kernels/ttt_merge.cuh"

namespace fsdp::kernels {
namespace {

using device::kWarpsPerBlock;
using device::merge_backward_kernel;
using device::merge_forward_kernel;
using launch::MergeShape;

unsigned blocks_for(const MergeShape& sh) {
  const int64_t items = sh.B * sh.nkv * sh.S;
  return static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

namespace launch {

const char* ttt_merge_forward(Dtype dt, const MergeShape& sh, const void* q, Strides sq,
                              const void* causal_out, Strides sc, const float* lse_c,
                              const void* kd, const void* vd, float scale, void* out, float* total,
                              void* stream) {
  if (sh.B * sh.nkv * sh.S == 0) return nullptr;
  if (sh.d > kMergeMaxHeadDim) return "ttt_merge: head size above 256";
  return device::with_storage_type(dt, [&](auto t0) -> const char* {
    using T = decltype(t0);
    merge_forward_kernel<T>
        <<<blocks_for(sh), 32 * kWarpsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
            sh, static_cast<const T*>(q), sq, static_cast<const T*>(causal_out), sc, lse_c,
            static_cast<const T*>(kd), static_cast<const T*>(vd), scale, static_cast<T*>(out),
            total);
    return device::error_text();
  });
}

const char* ttt_merge_backward(Dtype dt, const MergeShape& sh, const void* q, Strides sq,
                               const void* grad, Strides sg, const void* out, Strides so,
                               const float* total, const void* kd, const void* vd,
                               const void* dq_causal, Strides sdq, float scale, void* dq_out,
                               void* dkd, void* dvd, void* stream) {
  if (sh.B * sh.nkv * sh.S == 0) return nullptr;
  if (sh.d > kMergeMaxHeadDim) return "ttt_merge: head size above 256";
  const int64_t shared = kWarpsPerBlock * merge_shared_bytes_per_warp(sh.steps, sh.d);
  if (shared > kMergeMaxSharedBytes) return "ttt_merge: too many steps for the shared memory";
  return device::with_storage_type(dt, [&](auto t0) -> const char* {
    using T = decltype(t0);
    auto kernel = merge_backward_kernel<T>;
    kernel<<<blocks_for(sh), 32 * kWarpsPerBlock, static_cast<size_t>(shared),
             static_cast<cudaStream_t>(stream)>>>(
        sh, static_cast<const T*>(q), sq, static_cast<const T*>(grad), sg,
        static_cast<const T*>(out), so, total, static_cast<const T*>(kd), static_cast<const T*>(vd),
        static_cast<const T*>(dq_causal), sdq, scale, static_cast<T*>(dq_out), static_cast<T*>(dkd),
        static_cast<T*>(dvd));
    return device::error_text();
  });
}

}  // namespace launch
}  // namespace fsdp::kernels
