// GPU test gating for executables that link no communicator (unit_model): LibTorch's own probe,
// which reports false without a driver, as tests/support/gpu.h's FSDP_REQUIRE_GPU does through
// comm::gpu_count(). Without a usable GPU the test prints why it is skipped and returns.
#pragma once

#include <catch2/catch.hpp>

#include <torch/cuda.h>

#define TORCH_REQUIRE_GPU()                                         \
  do {                                                              \
    if (!torch::cuda::is_available()) {                             \
      WARN("skipped: no GPU visible (needs CUDA driver + device)"); \
      return;                                                       \
    }                                                               \
  } while (0)
