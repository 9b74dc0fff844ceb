// The loop's own part of a checkpoint: trainer_state.json (format version, optimizer step,
// epoch and sampler position, world size, batch plan, the effective configuration) and the CPU
// generator state. Plain data + file I/O; never touches model or optimizer tensors (the sharding
// engine saves those itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::train {

inline constexpr int kRunStateVersion = 1;

struct RunState {
  int64_t step = 0;      // optimizer steps done
  int64_t epoch = 0;     // epoch to continue in
  int64_t position = 0;  // micro-batches of `epoch` already consumed on every rank
  int64_t total_steps = 0;
  int64_t world_size = 0;
  int64_t accumulation_steps = 0;
  int64_t micro_batch_size = 0;
  int64_t skipped_steps = 0;  // non-finite steps skipped so far
  std::string config_json;    // effective configuration of the run that saved it
  std::string launch_id;      // the launcher's id of the launch that saved it (may be empty)
  std::string wandb_run_id;   // the W&B run it logged to (a resumed run continues it)
  std::string mlflow_run_id;  // the MLflow run it logged to (the same)
  // The epoch's metric sums so far, all ranks together (StepMetrics::global_sums): a resume in
  // the middle of an epoch reports the same epoch metrics as an uninterrupted run.
  std::vector<double> epoch_metric_sums;
};

// Writes dir/trainer_state.json and dir/rng_state.bin (the default CPU generator's state).
void save_run_state(const std::string& dir, const RunState& state);
// Reads trainer_state.json (and restores the CPU generator when rng_state.bin exists).
// Throws UsageError naming the file when it is missing, unreadable or of another version.
RunState load_run_state(const std::string& dir, bool restore_rng = true);

}  // namespace fsdp::train
