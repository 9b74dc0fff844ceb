// Which checkpoints a run resumes from (docs/reference.md §7, docs/checkpoints.md), decided
// before the model is built: --resume auto / PATH, a launcher restart (its own launch's
// checkpoints first), fallbacks past damaged checkpoints, and the refusals (a fresh run over
// another run's checkpoints, a PATH outside --output-dir next to other checkpoints). It reads
// the file system and asks the other ranks only through the agreement callbacks, so it is
// unit-tested without MPI (tests/unit/train/resume_plan.cpp). It never loads the engine.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "config/train_config.h"
#include "train/signals.h"

namespace fsdp::train {

struct ResumeRequest {
  config::ResumeMode mode = config::ResumeMode::kNone;
  std::string path;        // --resume PATH
  std::string output_dir;  // --output-dir (may be empty for --eval-only)
  bool eval_only = false;
  bool has_init_checkpoint = false;  // --init-checkpoint says where a fresh run starts
  LaunchAttempt launch;              // a launcher restart when attempt > 0
};

// How the ranks agree. Every call is collective: every rank makes the same calls in order.
struct ResumeAgreement {
  // True on every rank when `mine` is true on any.
  std::function<bool(bool mine)> any_rank;
  // Refuses (UsageError) unless every rank lists the same checkpoints.
  std::function<void(const std::vector<checkpoint::CheckpointRef>&)> check_same;
};

struct ResumePlan {
  // The checkpoints to try, newest first (empty: a fresh start).
  std::vector<checkpoint::CheckpointRef> candidates;
  // Whether a candidate that cannot be loaded falls back to the next (--resume auto, restarts).
  bool falls_back = false;
};

// Chooses the candidates, warning (rank 0's log) about restarts and checkpoints passed over, and
// throwing UsageError (exit 2) naming the directory and what to pass instead for the refusals.
ResumePlan plan_resume(const ResumeRequest& request, const ResumeAgreement& agree);

// True when checkpoint_dir is a directory directly in output_dir, however either is spelled
// (relative, trailing '/', symbolic links).
bool inside_output_dir(const std::string& checkpoint_dir, const std::string& output_dir);

}  // namespace fsdp::train
