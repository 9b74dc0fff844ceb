// The run's checkpoints (train/checkpointer.h): the output directory's lock, the agreed save,
// the resume candidates and the first loadable one. Never writes outside --output-dir.
#include "train/checkpointer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "core/timer.h"
#include "shard/engine.h"
#include "train/resume_plan.h"
#include "train/signals.h"

namespace fsdp::train {

void Checkpointer::lock_output_dir() {
  // Two runs in one directory would overwrite each other's checkpoints and metrics.
  const std::string& dir = output_dir();
  std::string holder;
  if (topo_.is_root()) {
    checkpoint::ensure_directory(dir);
    lock_ = std::make_unique<checkpoint::OutputDirLock>(dir);
    holder = lock_->acquire();
    // Alone in the directory now: what crashed saves left is put back or removed.
    if (holder.empty()) {
      for (const auto& line : checkpoint::recover_interrupted_saves(dir)) {
        FSDP_LOG0(kWarn) << "output directory: " << line;
      }
    }
  }
  const bool busy = topo_.any_rank(!holder.empty());
  FSDP_USAGE_CHECK(!busy,
                   "--output-dir " + dir + " is in use by another fsdp-train run" +
                       (holder.empty() ? std::string() : " (" + holder + ")"),
                   "wait for it to finish or stop it, or choose another --output-dir");
}

void Checkpointer::SaveAttempt::keep_error(const std::function<void()>& write) {
  try {
    write();
  } catch (const std::exception& e) {
    if (error_.empty()) error_ = error_text(e);
  }
}

void Checkpointer::SaveAttempt::on_root(const std::function<void()>& write) {
  if (topo_.is_root() && error_.empty()) keep_error(write);
}

void Checkpointer::SaveAttempt::on_every_rank(const std::function<void()>& write) {
  keep_error(write);
}

std::string Checkpointer::save(int64_t epoch, int64_t step,
                               const std::function<void(SaveAttempt&)>& write) const {
  Stopwatch w;
  checkpoint::CheckpointWriter writer(output_dir(), epoch, step);
  SaveAttempt attempt(topo_, writer.temp_dir());
  attempt.on_root([&] { writer.begin(); });
  topo_.control().barrier();
  write(attempt);
  bool failed = topo_.any_rank(!attempt.error().empty());
  if (!failed) attempt.on_root([&] { writer.commit(/*keep_last=*/0); });
  if (!failed) failed = topo_.any_rank(!attempt.error().empty());
  if (!failed && topo_.is_root()) prune_after_save(writer.final_dir());
  if (failed) {
    report_failed_save(writer, step, attempt.error());
    return "";
  }
  if (topo_.is_root()) {
    FSDP_LOG0(kInfo) << "saved checkpoint " << writer.final_dir() << " (" << w.seconds() << " s)";
    point_latest(writer.final_dir());
  }
  topo_.control().barrier();
  return writer.final_dir();
}

void Checkpointer::prune_after_save(const std::string& saved) const {
  // After the new checkpoint is complete: a failure is only a warning.
  if (cfg_.checkpoint.keep_last <= 0) return;
  try {
    checkpoint::prune(output_dir(), cfg_.checkpoint.keep_last, saved);
  } catch (const std::exception& e) {
    FSDP_LOG(kWarn) << "after saving " << saved << ", removing older checkpoints "
                    << "(--keep-last) failed: " << error_text(e);
  }
}

void Checkpointer::report_failed_save(const checkpoint::CheckpointWriter& writer, int64_t step,
                                      const std::string& error) const {
  if (!error.empty()) {
    FSDP_LOG(kError) << "rank " << topo_.rank() << ": the checkpoint of step " << step
                     << " could not be written: " << error;
  }
  if (topo_.is_root()) {
    remove_tree(writer.temp_dir());
    FSDP_LOG0(kWarn) << "checkpoint of step " << step << " NOT saved (see the error "
                     << "above; free space in " << output_dir()
                     << "); training goes on and the next save tries again; "
                     << newest_checkpoint_text();
  }
  topo_.control().barrier();
}

void Checkpointer::prune(const std::string& keep) const {
  if (cfg_.checkpoint.keep_last > 0)
    checkpoint::prune(output_dir(), cfg_.checkpoint.keep_last, keep);
}

void Checkpointer::point_latest(const std::string& checkpoint_dir) const {
  // A convenience for people and scripts: resume never reads it (it lists the checkpoints), so a
  // link that cannot be made is only a warning.
  try {
    checkpoint::point_link(output_dir(), checkpoint::kLatestLink, checkpoint_dir);
  } catch (const std::exception& e) {
    FSDP_LOG0(kWarn) << "<output-dir>/" << checkpoint::kLatestLink
                     << " not updated: " << error_text(e);
  }
}

std::string Checkpointer::newest_checkpoint_text() const {
  const auto latest = checkpoint::find_latest(output_dir());
  return latest
             ? "the newest complete checkpoint is " + latest->path + " (--resume continues from it)"
             : std::string("there is no complete checkpoint");
}

void Checkpointer::check_same_checkpoints(
    const std::vector<checkpoint::CheckpointRef>& list) const {
  // Every rank must see the same checkpoints (one --output-dir shared by all): count and step
  // sum agree (the max of each and of its negation).
  int64_t step_sum = 0;
  for (const auto& c : list) step_sum += c.step;
  at::Tensor seen = at::tensor({static_cast<int64_t>(list.size()), step_sum}, at::kLong);
  at::Tensor low = -seen;
  topo_.control().all_reduce(seen, comm::ReduceOp::kMax)->wait();
  topo_.control().all_reduce(low, comm::ReduceOp::kMax)->wait();
  FSDP_USAGE_CHECK(at::equal(seen, -low),
                   "--resume: the ranks see different checkpoints in " + output_dir(),
                   "--output-dir must be one directory shared by every rank");
}

void Checkpointer::plan_resume() {
  ResumeRequest request;
  request.mode = cfg_.checkpoint.resume;
  request.path = cfg_.checkpoint.resume_path;
  request.output_dir = output_dir();
  request.eval_only = cfg_.loop.eval_only;
  request.has_init_checkpoint = !cfg_.model.init_checkpoint.empty();
  request.launch = launch_attempt();
  ResumeAgreement agree;
  agree.any_rank = [this](bool mine) { return topo_.any_rank(mine); };
  agree.check_same = [this](const auto& list) { check_same_checkpoints(list); };
  ResumePlan plan = train::plan_resume(request, agree);
  candidates_ = std::move(plan.candidates);
  falls_back_ = plan.falls_back;
}

namespace {

// Loads `path` into the engine and returns its run state; throws when it cannot.
RunState load_one(shard::ShardEngine& engine, const std::string& path, bool fresh_optimizer) {
  RunState saved = load_run_state(path);
  const std::string state_dir = checkpoint::join_path(path, checkpoint::layout::kTrainState);
  shard::load_state(engine, state_dir, fresh_optimizer);
  // trainer_state.json and the shard manifest were written by the same save: the optimizer
  // steps taken (the manifest's step) are the trainer's steps less the skipped ones.
  const int64_t manifest_step = engine.step_count();
  FSDP_USAGE_CHECK(
      manifest_step <= saved.step &&
          manifest_step >= saved.step - std::max<int64_t>(saved.skipped_steps, 0),
      fsdp::str(checkpoint::join_path(path, checkpoint::layout::kRunState), " says step ",
                saved.step, " (", saved.skipped_steps, " skipped), ",
                checkpoint::join_path(state_dir, checkpoint::layout::kShardManifest), " says ",
                manifest_step, " optimizer steps: the checkpoint is damaged"),
      "resume from an older checkpoint (--resume auto falls back to one)");
  return saved;
}

}  // namespace

std::pair<RunState, std::string> Checkpointer::load_first_loadable(
    shard::ShardEngine& engine) const {
  const std::vector<checkpoint::CheckpointRef>& candidates = candidates_;
  for (size_t i = 0;; ++i) {
    const std::string& path = candidates[i].path;
    std::string error;
    RunState saved;
    try {
      saved = load_one(engine, path, cfg_.checkpoint.reset_optimizer_state);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
    if (!topo_.any_rank(!error.empty())) return {saved, path};
    if (!error.empty()) {
      FSDP_LOG(kError) << "rank " << topo_.rank() << ": cannot load checkpoint " << path << ": "
                       << error;
    }
    // A checkpoint the user named (or the last one left) that cannot be loaded is a usage error
    // (exit 2) naming the file, whatever the reader threw.
    FSDP_USAGE_CHECK(i + 1 < candidates.size(),
                     "--resume: checkpoint " + path + " could not be loaded" +
                         (error.empty() ? std::string(" (on another rank: see its error above)")
                                        : ": " + error) +
                         (candidates.size() > 1 ? ", nor any older one" : ""),
                     !falls_back_
                         ? "pick another checkpoint, or --resume auto (it falls back to older ones)"
                         : "check the files named above; to start over use another --output-dir");
    FSDP_LOG0(kWarn) << "checkpoint " << path << " could not be loaded ("
                     << (error.empty() ? std::string("on another rank, see the error above")
                                       : error)
                     << "): resuming from the next older one, " << candidates[i + 1].path;
  }
}

void Checkpointer::set_aside_newer(const std::string& loaded, int64_t step) const {
  // Checkpoints after the one resumed from belong to an abandoned branch: set aside, so that
  // this run's saves do not overwrite them and a later --resume auto does not take them.
  if (!topo_.is_root() || cfg_.loop.eval_only || !inside_output_dir(loaded, output_dir())) return;
  const auto moved_aside = checkpoint::set_aside_newer(output_dir(), step);
  for (const auto& moved : moved_aside) {
    FSDP_LOG0(kWarn) << "resumed from step " << step << ": the newer checkpoint is set "
                     << "aside as " << moved << " (another branch of the run; nothing deleted)";
  }
  if (!moved_aside.empty()) point_latest(loaded);  // the link named a checkpoint set aside
}

}  // namespace fsdp::train
