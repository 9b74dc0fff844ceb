// The one place that turns the run configuration into each component's options: the sharding
// engine, the data loader, the loss, the metrics sinks, the profiler and the learning-rate
// schedule, including the translation of config's enums into each library's own. Pure: nothing
// here reads files, the environment or other ranks (tests/unit/train/component_options.cpp
// covers every enum value).
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "config/train_config.h"
#include "data/loader.h"
#include "metrics/profiler.h"
#include "metrics/sinks.h"
#include "model/memory_estimate.h"
#include "model/ttt_loss.h"
#include "optim/lr_schedule.h"
#include "shard/options.h"
#include "train/run_state.h"

namespace fsdp::train {

// The enums of config mirrored by the libraries (each library keeps its own so that it never
// depends on lib/config).
shard::Strategy to_engine(config::ShardingStrategy s);
shard::EngineOptions::StepScalars to_engine(config::StepScalars s);
c10::ScalarType to_dtype(config::Precision p);  // --mixed-precision, --reduce-dtype, ...
model::LossNormalization to_loss(config::LossNormalization n);
model::LossOptions::LK to_lk(config::LkLossType t);
optim::LrDecay to_decay(config::LrScheduler s);
data::NoiseType to_noise(config::NoiseType t);

// The engine's options on `device` (validated by the engine, not here).
shard::EngineOptions engine_options(const config::TrainConfig& cfg, c10::Device device);

// The loader's options: --loader-threads 0 means one reader on the CPU and four on a GPU. Noise
// stays off: evaluation loaders use these as they are, the training loader adds noise_options.
data::LoaderOptions loader_options(const config::TrainConfig& cfg, c10::Device device);

// The aux hidden-state noise of the training loader: --noise-std, --noise-type, keyed by --seed.
data::NoiseOptions noise_options(const config::TrainConfig& cfg);

// The loss of one micro-batch, divided by `accumulation` (1 for evaluation).
// seq_group: the sequence-parallel group (--sp-ulysses-size > 1), or none.
model::LossOptions loss_options(const config::TrainConfig& cfg, int64_t accumulation,
                                model::SeqGroup* seq_group = nullptr);

// The profiler of rank `rank`. Without --profile-dir the traces go to env_profiler_dir (the
// value of SGLANG_TORCH_PROFILER_DIR, where SpecForge writes; empty when unset), else to
// <output-dir>/profile.
metrics::ProfilerOptions profiler_options(const config::TrainConfig& cfg, c10::Device device,
                                          int rank, const std::string& env_profiler_dir);

// The metrics sinks of a training run at `state` (fresh or resumed): `restarted` is true for a
// launcher restart, which continues the TensorBoard session even at step 0.
metrics::SinkContext sink_context(const config::TrainConfig& cfg, int rank, int64_t total_steps,
                                  const std::string& config_json, const RunState& state,
                                  bool restarted);

// What the start-up memory check needs besides the draft's sizes (model/memory_estimate.h):
// `micro_batch` from the batch plan, `node_ranks` the ranks on this node (the hybrid_shard group,
// and the ranks sharing one host's memory on the CPU).
model::MemoryPlan memory_plan(const config::TrainConfig& cfg, c10::Device device,
                              int64_t micro_batch, int64_t world, int64_t node_ranks);

// The warmup length: --warmup-steps, else --warmup-ratio of total_steps.
int64_t warmup_steps(const config::TrainConfig& cfg, int64_t total_steps);

}  // namespace fsdp::train
