// --fused-cuda-kernels' default (train::fused_kernels_on, docs/model.md "Fused CUDA kernels"): on
// wherever the kernels can run (a GPU run of a build with them), off on the CPU whatever the
// default says, and an explicit true where they cannot run is a usage error naming the flag.
#include <catch2/catch.hpp>

#include <c10/core/Device.h>

#include <string>

#include "core/error.h"
#include "kernels/fused.h"
#include "train/trainer.h"

using fsdp::config::TrainConfig;

namespace {

TrainConfig with(bool value, bool given) {
  TrainConfig cfg;
  cfg.model.fused_cuda_kernels = value;
  if (given) cfg.given_options["fused-cuda-kernels"] = "--fused-cuda-kernels";
  return cfg;
}

}  // namespace

TEST_CASE("fused kernels: on by default where they can run, never on the CPU", "[train]") {
  const c10::Device cpu(c10::kCPU), gpu(c10::kCUDA, 0);
  CHECK(TrainConfig{}.model.fused_cuda_kernels);  // the default asks for them
  CHECK_FALSE(fsdp::train::fused_kernels_on(with(true, false), cpu));
  CHECK(fsdp::train::fused_kernels_on(with(true, false), gpu) == fsdp::kernels::compiled());
  CHECK_FALSE(fsdp::train::fused_kernels_on(with(false, true), gpu));
  CHECK_FALSE(fsdp::train::fused_kernels_on(with(false, true), cpu));
  try {
    fsdp::train::fused_kernels_on(with(true, true), cpu);
    FAIL("an explicit --fused-cuda-kernels true on the CPU was accepted");
  } catch (const fsdp::UsageError& e) {
    CHECK(std::string(e.what()).find("--fused-cuda-kernels") != std::string::npos);
  }
  if (fsdp::kernels::compiled()) CHECK(fsdp::train::fused_kernels_on(with(true, true), gpu));
}
