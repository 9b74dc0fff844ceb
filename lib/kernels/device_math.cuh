// Device helpers shared by the kernels: fp32 conversion of the storage types, warp and block
// reductions, and the (max, sum) pair of an online softmax. Device code only (or, for the tests,
// kernels/emulation.h's host threads); no LibTorch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/launch.h"

#ifdef FSDP_KERNEL_EMULATION
#include "kernels/emulation.h"  // tests only: the same kernel source run on host threads
#define FSDP_DYNAMIC_SHARED(T, name) T* name = ::fsdp::kernels::emu::dynamic_shared<T>()
#else
#include <cuda_runtime.h>
#define FSDP_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

namespace fsdp::kernels::device {

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Running (max, sum of exp(x - max)) of an online softmax; -inf entries contribute nothing.
struct MaxSum {
  float m = -INFINITY, s = 0.f;
  __device__ __forceinline__ void add(float x) {
    if (x == -INFINITY) return;
    if (x > m) {
      s = s * expf(m - x) + 1.f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  __device__ __forceinline__ void merge(float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
      m = m2;
      s = s2;
    } else if (m2 > m) {
      s = s * expf(m - m2) + s2;
      m = m2;
    } else {
      s += s2 * expf(m2 - m);
    }
  }
  // NaN in, NaN out (as the composite log_softmax); -inf for an all -inf row.
  __device__ __forceinline__ float lse() const { return m == -INFINITY ? m : m + logf(s); }
};

__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, v.m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, v.s, o);
    v.merge(m2, s2);
  }
  return v;
}

// Block-wide sums of two values (every thread gets them); blockDim.x a multiple of 32, at most
// 1024. `scratch` holds 2 * 32 floats; the block synchronises inside.
__device__ __forceinline__ void block_sum2(float& a, float& b, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();  // scratch may still be read by an earlier reduction
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? scratch[lane] : 0.f;
  b = lane < warps ? scratch[32 + lane] : 0.f;
  a = warp_sum(a);
  b = warp_sum(b);
}

__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max_sum(v);
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = v.m;
    scratch[32 + warp] = v.s;
  }
  __syncthreads();
  MaxSum r;
  if (lane < warps) {
    r.m = scratch[lane];
    r.s = scratch[32 + lane];
  }
  return warp_max_sum(r);
}

// Calls f(T{}) with T the storage type of dt (float, __nv_bfloat16, __half) and returns what f
// returns (a launcher's error text, null on success).
template <class F>
const char* with_storage_type(launch::Dtype dt, F&& f) {
  switch (dt) {
    case launch::Dtype::kFloat32:
      return f(float{});
    case launch::Dtype::kBFloat16:
      return f(__nv_bfloat16{});
    case launch::Dtype::kFloat16:
      return f(__half{});
  }
  return "fused CUDA kernels: unknown dtype";
}

#ifndef FSDP_KERNEL_EMULATION
inline const char* error_text() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}
#endif

}  // namespace fsdp::kernels::device
