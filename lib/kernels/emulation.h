// Host emulation of the part of CUDA's execution model the kernels use, for the tests only
// (tests/unit/kernels/emulation.cpp): each block's threads are std::threads; __syncthreads and
// __syncwarp are barriers, __shfl_xor_sync goes through a per-warp exchange between two warp
// barriers, and blocks run one after another (so a kernel's static shared array serves every
// block in turn). It lets the exact kernel source run on a machine without a GPU; it is never
// compiled into fsdp-train. Included by device_math.cuh when FSDP_KERNEL_EMULATION is defined.
#pragma once

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

// CUDA's headers (included first) define these for a host compiler: redefined for the emulation.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

namespace fsdp::kernels::emu {

struct Dim {
  unsigned x = 0;
};

struct Block {
  explicit Block(unsigned threads, size_t shared_bytes)
      : all(threads), exchange(threads), shared(shared_bytes / sizeof(float) + 1) {
    for (unsigned w = 0; w < (threads + 31) / 32; ++w)
      warps.push_back(std::make_unique<std::barrier<>>(32));
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> exchange;  // one slot per thread
  std::vector<float> shared;    // the launch's dynamic shared memory
};

inline thread_local Block* block = nullptr;
inline thread_local Dim thread_index, block_index;
inline Dim block_dim;

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(block->shared.data());
}

// kernel<<<grid, threads, shared_bytes>>>(args...), threads a multiple of 32.
template <class Kernel, class... Args>
void launch(unsigned grid, unsigned threads, size_t shared_bytes, Kernel kernel, Args... args) {
  block_dim.x = threads;
  for (unsigned b = 0; b < grid; ++b) {
    Block state(threads, shared_bytes);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&state, b, t, kernel, args...] {
        block = &state;
        thread_index.x = t;
        block_index.x = b;
        kernel(args...);
      });
    }
    for (auto& th : pool) th.join();
  }
}

}  // namespace fsdp::kernels::emu

#define threadIdx (::fsdp::kernels::emu::thread_index)
#define blockIdx (::fsdp::kernels::emu::block_index)
#define blockDim (::fsdp::kernels::emu::block_dim)

inline void __syncthreads() {
  ::fsdp::kernels::emu::block->all.arrive_and_wait();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::fsdp::kernels::emu::block->warps[threadIdx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  auto* b = ::fsdp::kernels::emu::block;
  const unsigned t = threadIdx.x;
  b->exchange[t] = v;
  __syncwarp();
  const float other = b->exchange[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned>(lane_mask))];
  __syncwarp();
  return other;
}
