// GPU test gating: [cuda]/[nccl] tests call FSDP_REQUIRE_GPU() first; without a usable GPU the
// test prints why it is skipped and returns (Catch2 v2 has no SKIP).
#pragma once

#include <catch2/catch.hpp>

#include "comm/runtime.h"

#define FSDP_REQUIRE_GPU()                                                                   \
  do {                                                                                       \
    if (::fsdp::comm::gpu_count() == 0) {                                                    \
      WARN("skipped: no GPU visible (needs CUDA driver + device; runs on the GPU machine)"); \
      return;                                                                                \
    }                                                                                        \
  } while (0)
