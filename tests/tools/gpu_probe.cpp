// Test helper: says whether a usable GPU is here, asking the same two probes the in-test guards
// ask (comm::gpu_count() for FSDP_REQUIRE_GPU, torch::cuda::is_available() for
// TORCH_REQUIRE_GPU), so tests/support/gpu_gate.sh can report a GPU test as skipped to ctest
// before it starts. Never used outside tests.
//
//   gpu_probe [MIN]   exit 0: at least MIN GPUs (default 1) and LibTorch sees CUDA;
//                     exit 1: not so (the reason on stdout); exit 2: bad arguments.
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/runtime.h"

int main(int argc, char** argv) {
  if (argc > 2) {
    std::fprintf(stderr, "usage: gpu_probe [MIN]\n");
    return 2;
  }
  const int want = argc == 2 ? std::atoi(argv[1]) : 1;
  if (want < 1) {
    std::fprintf(stderr, "gpu_probe: MIN must be a positive number, got '%s'\n", argv[1]);
    return 2;
  }
  const int gpus = fsdp::comm::gpu_count();
  const bool torch_cuda = torch::cuda::is_available();
  std::printf("GPUs visible to fsdp-train: %d (needed: %d); LibTorch CUDA available: %s\n", gpus,
              want, torch_cuda ? "yes" : "no");
  return gpus >= want && torch_cuda ? 0 : 1;
}
