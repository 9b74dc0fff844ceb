// The Trainer composes the components (docs/architecture.md): configuration, data,
// vocabulary mapping, target head, draft model, sharding engine, metrics and checkpoints, and
// runs the loop of docs/reference.md §6: micro-batches, accumulation, clipping, the LR schedule,
// evaluation and logging at their intervals, a non-finite guard, saving on SIGTERM/SIGINT, and
// exact resume. It never parses flags and never talks to MPI directly (lib/comm does).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace c10 {
struct Device;
}

namespace fsdp::train {

// Whether this run uses fsdp-train's CUDA kernels (--fused-cuda-kernels): by default wherever
// they can run (a GPU, a build with them: 1.15x tokens/s and less memory on an H200,
// docs/benchmarks.md "GPU"), never on the CPU; given true where they cannot run, a usage error.
bool fused_kernels_on(const config::TrainConfig& cfg, const c10::Device& device);

class TrainLoop;

struct RunResult {
  int64_t steps = 0;  // optimizer steps done when the run ended
  bool stopped_by_signal = false;
  std::string last_checkpoint;                             // empty when none was written
  std::vector<std::pair<std::string, double>> final_eval;  // eval-only / last evaluation
};

class Trainer {
 public:
  // The configuration must already be resolved (config::resolve); the trainer validates it
  // against the world size and the model (sizes that must agree with the target) itself.
  explicit Trainer(config::TrainConfig cfg);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Training (or evaluation with --eval-only). Collective over the world.
  RunResult run();

  // Consecutive non-finite steps after which the run aborts.
  static constexpr int kMaxConsecutiveNonFinite = 5;

 private:
  friend class TrainLoop;  // train_loop.cpp: one training run over Impl's parts
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::train
