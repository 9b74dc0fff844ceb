// The run's checkpoints in --output-dir (docs/reference.md §7): the lock that keeps one training
// run per directory, the save protocol in which every rank agrees on the outcome (a failed write
// anywhere fails the save everywhere, and the earlier checkpoints stay), the `latest` link,
// pruning, the checkpoints a resume would load and the first one every rank can load. What goes
// into a checkpoint is the caller's (Trainer::Impl::save); where it goes is lib/checkpoint's
// layout. Every collective here runs on every rank.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "config/train_config.h"
#include "train/run_state.h"
#include "train/run_topology.h"

namespace fsdp::shard {
class ShardEngine;
}

namespace fsdp::train {

class Checkpointer {
 public:
  // `cfg` and `topo` outlive the checkpointer (the trainer owns all three).
  Checkpointer(const config::TrainConfig& cfg, const RunTopology& topo) : cfg_(cfg), topo_(topo) {}

  const std::string& output_dir() const { return cfg_.checkpoint.output_dir; }

  // One training run per --output-dir at a time; rank 0 holds the lock until the process ends
  // and recovers what interrupted saves left. A usage error when another run holds it.
  // Collective.
  void lock_output_dir();

  // Chooses the checkpoints a resume would load (train::plan_resume in resume_plan.h), before
  // the model is built: the model takes its vocabulary mapping from the first. Collective.
  void plan_resume();
  const std::vector<checkpoint::CheckpointRef>& resume_candidates() const { return candidates_; }
  bool resuming() const { return !candidates_.empty(); }
  // The first candidate every rank loads (engine state, run state) and its path; a usage error
  // when none does. Collective.
  std::pair<RunState, std::string> load_first_loadable(shard::ShardEngine& engine) const;
  // Rank 0, after resuming from `loaded` at `step`: newer checkpoints in --output-dir belong to an
  // abandoned branch and are set aside (renamed, nothing deleted).
  void set_aside_newer(const std::string& loaded, int64_t step) const;

  // The writes of one save into its temporary directory, with the first error kept: a write
  // that fails (full disk, file size limit) on any rank fails the save on every rank, and the
  // collective writes still run everywhere before the ranks agree.
  class SaveAttempt {
   public:
    SaveAttempt(const RunTopology& topo, std::string dir) : topo_(topo), dir_(std::move(dir)) {}
    const std::string& dir() const { return dir_; }
    const std::string& error() const { return error_; }
    // Runs `write` on rank 0 unless an earlier write failed.
    void on_root(const std::function<void()>& write);
    // Runs `write` on every rank, also after an error of its own (a collective).
    void on_every_rank(const std::function<void()>& write);

   private:
    void keep_error(const std::function<void()>& write);
    const RunTopology& topo_;
    std::string dir_;
    std::string error_;
  };
  // Saves the checkpoint epoch_<epoch>_step_<step>: `write` fills the temporary directory (on
  // every rank; what it gathers from all ranks runs outside the attempt), then the ranks agree,
  // rank 0 publishes it, prunes beyond --keep-last and points `latest` at it. Returns its
  // directory, or "" when a write failed on some rank (every rank returns "" then; the earlier
  // checkpoints are untouched). Collective.
  std::string save(int64_t epoch, int64_t step,
                   const std::function<void(SaveAttempt&)>& write) const;
  // Rank 0: points <output-dir>/latest at checkpoint_dir (a warning when it cannot).
  void point_latest(const std::string& checkpoint_dir) const;
  // Rank 0: removes checkpoints beyond --keep-last (never `keep`); nothing without --keep-last.
  void prune(const std::string& keep) const;
  // "the newest complete checkpoint is ... (--resume continues from it)" or that there is none.
  std::string newest_checkpoint_text() const;

 private:
  // Exits 2 unless every rank lists the same checkpoints (collective).
  void check_same_checkpoints(const std::vector<checkpoint::CheckpointRef>& list) const;
  // The failure path of save(): logs, removes the partial directory. Collective.
  void report_failed_save(const checkpoint::CheckpointWriter& writer, int64_t step,
                          const std::string& error) const;
  // Rank 0 after a complete save: older checkpoints beyond --keep-last go (a warning when not).
  void prune_after_save(const std::string& saved) const;

  const config::TrainConfig& cfg_;
  const RunTopology& topo_;
  std::vector<checkpoint::CheckpointRef> candidates_;
  bool falls_back_ = false;  // try older candidates when one cannot be loaded
  std::unique_ptr<checkpoint::OutputDirLock> lock_;  // rank 0, training runs
};

}  // namespace fsdp::train
