// Private state of the Trainer, shared by trainer.cpp (set-up, model, evaluation),
// trainer_checkpoints.cpp (what a save writes, resume) and train_loop.cpp (the loop, composed
// from cadence.h, step_runner.h and component_options.h). The Trainer owns its parts as objects
// with their own interfaces: the topology (run_topology.h), the checkpointer (checkpointer.h),
// the serving plan (checkpoint/serving_contract.h). Not part of the public API; include only from
// lib/train.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export.h"
#include "comm/communicator.h"
#include "comm/runtime.h"
#include "config/options.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/spool.h"
#include "metrics/profiler.h"
#include "metrics/sinks.h"
#include "shard/engine.h"
#include "train/algo/algorithm.h"
#include "train/checkpointer.h"
#include "train/evaluator.h"
#include "train/run_state.h"
#include "train/run_topology.h"
#include "train/trainer.h"

namespace fsdp::train {

struct Trainer::Impl {
  config::TrainConfig cfg;
  // Who takes part: ranks, the sequence- and data-parallel layout, the device, communicators.
  RunTopology topo;
  // The output directory's lock, saves and the resume candidates (over cfg and topo).
  Checkpointer checkpointer{cfg, topo};
  // The draft family (train/algo/algorithm.h): its model under the sharding engine, its step,
  // metrics and exports. Chosen once from the draft config (train/algo/registry.h).
  std::unique_ptr<algo::Algorithm> algo;
  std::shared_ptr<data::FeatureDataset> train_ds, eval_ds;
  // --stream: the spool producers fill (data/spool.h); train_ds is then its first arrivals, what
  // the start-up checks read. trainer_stream.cpp holds the trainer's side of it.
  std::shared_ptr<data::Spool> spool;
  // Evaluations of the current weights (created with the model).
  std::unique_ptr<Evaluator> evaluator;
  std::unique_ptr<metrics::MetricsLogger> logger;
  config::BatchPlan plan;
  int64_t total_steps = 0, warmup = 0;
  RunState state;
  std::string config_json;
  checkpoint::DraftExport init_export;
  bool have_init_export = false;

  explicit Impl(config::TrainConfig c) : cfg(std::move(c)) {}

  // Set-up, in this order (trainer.cpp): ranks, batch plan, device, threads, communicators,
  // data, the loss-mask and evaluation-set checks, the output directory lock, the resume plan,
  // then the model.
  void setup();
  void plan_batches();
  // Sets the intra-op threads; returns "N thread(s) per rank (source)" for the start-up line.
  std::string set_threads(const comm::Topology& topo) const;
  // The algorithm of the draft config, with the topology's parts it may use.
  void choose_algorithm();
  void open_data();               // opens the feature sets and reads one sample of each
  void check_loss_masks() const;  // exit 2 for sets without (almost any) loss tokens
  // The algorithm's model under the sharding engine, from the initial weights of
  // --init-checkpoint and the newest resume candidate's vocabulary.
  void build_model();
  // Saves a checkpoint (Checkpointer::save with this run's contents: the export, the sharded
  // state, the run state); returns its directory, or "" when a write failed on some rank (every
  // rank returns "" then; the earlier checkpoints are untouched). Collective.
  std::string save(int64_t epoch_for_name);
  // Loads the first loadable candidate (engine, run state), sets newer checkpoints aside.
  void resume_if_asked();
  // The resumed position when the checkpoint was saved with another ranks x micro-batch layout.
  void adopt_layout(const RunState& saved);
  // Warns (rank 0) about settings that change the computation and differ from saved_json, the
  // resumed checkpoint's recorded configuration.
  void report_changed_settings(const std::string& saved_json) const;
  RunResult train();
  RunResult eval_only();

  // Streaming (trainer_stream.cpp). check_stream_options: --total-steps given, one epoch, no
  // sequence parallelism. open_stream: the spool and its first arrivals as train_ds.
  void check_stream_options() const;
  void open_stream();
  // The loader's dataset: the stream's positions, as many as --total-steps can train.
  std::shared_ptr<data::FeatureDataset> stream_positions() const;
  // Positions of the stream the run state has consumed (--total-steps' worth once the epoch
  // ended: the stream ran out, or the run trained all it may).
  int64_t stream_consumed() const;
  // Rank 0 inside a save: <checkpoint>/stream.json, what the checkpoint consumed and needs.
  void write_stream_record(const std::string& dir) const;
  // Rank 0 after a complete save: deletes the samples it acknowledges.
  void acknowledge_stream() const;
  // After resuming (or starting fresh): the checkpoint's stream record against the spool's.
  void check_stream_resume(const std::string& loaded) const;
  void check_stream_fresh() const;
  // Collective: whether the budget asks for a checkpoint now (rank 0 decides).
  bool stream_wants_checkpoint() const;
  // The stream's scalars for the training log (rank 0's view).
  std::vector<std::pair<std::string, double>> stream_scalars() const;
  void log_stream_end() const;
  // UsageError unless an epoch of per_epoch micro-batches per rank holds one optimizer step (a
  // warning when its last step is partial); returns the optimizer steps per epoch.
  int64_t check_epoch(int64_t per_epoch) const;
  // Warns (rank 0) when this run's epochs end before or after the resumed schedule's end.
  void warn_resumed_schedule(int64_t per_epoch, int64_t steps_per_epoch) const;
  // Rank 0 at the start of training: writes run_config.yaml, logs the sizes and the plan.
  void log_run_start(int64_t per_epoch) const;
};

}  // namespace fsdp::train
