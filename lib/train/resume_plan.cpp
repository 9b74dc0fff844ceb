// Choosing what a run resumes from (see resume_plan.h). Every agreement below runs on every
// rank in the same order; only rank 0's log lines are printed (FSDP_LOG0).
#include "train/resume_plan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/block_draft_contract.h"
#include "checkpoint/export.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dflash_config.h"
#include "model/draft_config.h"
#include "train/run_state.h"

namespace fsdp::train {

namespace {

using Refs = std::vector<checkpoint::CheckpointRef>;

// A restart by the launcher continues from the newest checkpoint of its own launch (the output
// directory may hold older runs' checkpoints). Which checkpoints are the launch's is agreed: a
// rank that cannot read one's state says no. Newest first; empty for a first start.
Refs own_launch_checkpoints(const ResumeRequest& r, const ResumeAgreement& agree) {
  Refs own;
  if (r.launch.attempt <= 0 || r.launch.launch_id.empty()) return own;
  const auto listing = checkpoint::list_complete(r.output_dir);
  agree.check_same(listing);  // one agreement per checkpoint follows
  for (const auto& c : listing) {
    bool mine = false;
    try {
      mine = load_run_state(c.path, /*restore_rng=*/false).launch_id == r.launch.launch_id;
    } catch (const std::exception&) {
      // Unreadable state: not a candidate (the loading loop would only fail on it).
    }
    if (!agree.any_rank(!mine)) own.push_back(c);
  }
  std::reverse(own.begin(), own.end());
  FSDP_LOG0(kWarn) << "restart " << r.launch.attempt << " of launch " << r.launch.launch_id << ": "
                   << (own.empty()
                           ? "no checkpoint of this launch yet, starting as the first attempt did"
                           : "resuming from " + own.front().path);
  return own;
}

// --resume PATH: a complete checkpoint, and (for a training run that is not a restart) not one
// outside --output-dir while --output-dir holds another run's checkpoints.
checkpoint::CheckpointRef requested_path(const ResumeRequest& r, bool restarting) {
  const std::string& dir = r.path;
  const bool export_only =
      std::filesystem::is_regular_file(checkpoint::join_path(dir, checkpoint::layout::kModel)) &&
      !checkpoint::is_complete(dir) &&
      !std::filesystem::exists(checkpoint::join_path(dir, checkpoint::layout::kTrainState));
  FSDP_USAGE_CHECK(
      checkpoint::is_complete(dir),
      "--resume " + dir + ": not a complete checkpoint directory (no " +
          checkpoint::kCompleteMarker + " marker)",
      export_only ? "it holds weights only (a SpecForge checkpoint or an export), no "
                    "optimizer state to resume: start from its weights with "
                    "--init-checkpoint " +
                        dir + " (or --ckpt-dir) instead of --resume"
      : std::filesystem::exists(checkpoint::join_path(dir, checkpoint::layout::kTrainState))
          ? "its save was interrupted (the marker is written last), so its files "
            "may be incomplete: resume from an older checkpoint, or --resume auto"
          : "point --resume at an epoch_<E>_step_<S> directory, or use --resume "
            "auto");
  // Continuing a checkpoint of another directory: this run's saves must not mix with a run
  // whose checkpoints are in --output-dir.
  if (!restarting && !r.eval_only && !inside_output_dir(dir, r.output_dir)) {
    const auto other = checkpoint::find_latest(r.output_dir);
    FSDP_USAGE_CHECK(
        !other,
        "--resume " + dir + " is outside --output-dir " + r.output_dir +
            ", which holds checkpoints of another run (the newest: " +
            (other ? other->path : std::string()) + "): the two runs' checkpoints would mix",
        "continue into an empty --output-dir, or resume a checkpoint of " + r.output_dir);
  }
  checkpoint::CheckpointRef ref;
  ref.path = dir;
  return ref;
}

// Whether the config file names a block draft's architecture (DFlash, DSpark); false when the
// file is absent or unreadable (the EAGLE3 checks then report it).
bool block_draft_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return false;
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && checkpoint::block_draft_kind(j).has_value();
}

// With fallback, a checkpoint whose weights file or config cannot be read (damaged after the
// save) is passed over like one whose training state cannot be loaded. Agreed over ranks.
Refs readable_candidates(const Refs& candidates, const ResumeRequest& r,
                         const ResumeAgreement& agree) {
  Refs readable;
  for (const auto& c : candidates) {
    std::string problem;
    try {
      const auto [d2t, t2d] = checkpoint::read_export_mapping(c.path);
      const std::string config = checkpoint::join_path(c.path, checkpoint::layout::kConfig);
      if (block_draft_config(config)) {
        model::load_dflash_config(config);  // a block draft (DFlash, DSpark): no vocabulary map
      } else {
        if (!d2t.defined() || !t2d.defined()) problem = "model.safetensors has no d2t/t2d";
        if (std::filesystem::is_regular_file(config)) model::load_draft_config(config);
      }
    } catch (const std::exception& e) {
      problem = error_text(e);
    }
    if (!agree.any_rank(!problem.empty())) {
      readable.push_back(c);
    } else {
      FSDP_LOG0(kWarn) << "checkpoint " << c.path << " cannot be resumed"
                       << (problem.empty() ? " (on another rank)" : ": " + problem)
                       << "; trying the next older one";
    }
  }
  FSDP_USAGE_CHECK(
      candidates.empty() || !readable.empty(),
      "--resume: no checkpoint in " + r.output_dir + " can be read (see the warnings above)",
      "check the files named above; to start over use another --output-dir");
  return readable;
}

// Nothing to resume: never start over silently next to another trainer's checkpoints (that
// run's epochs would look resumed and be lost), nor over this trainer's own.
void check_fresh_start(const ResumeRequest& r) {
  const auto foreign = r.mode == config::ResumeMode::kAuto && !r.has_init_checkpoint
                           ? checkpoint::list_foreign_exports(r.output_dir)
                           : std::vector<std::string>{};
  std::string names;
  for (size_t i = 0; i < foreign.size() && i < 3; ++i) names += (i ? ", " : "") + foreign[i];
  if (foreign.size() > 3) names += ", ...";
  FSDP_USAGE_CHECK(
      foreign.empty(),
      "--resume: " + r.output_dir + " has no fsdp-train checkpoint to resume, but " +
          std::to_string(foreign.size()) + " draft checkpoint(s) without optimizer state (" +
          names + "), e.g. from SpecForge",
      "to continue from those weights with a fresh optimizer and schedule, pass "
      "--init-checkpoint <that directory> (or --ckpt-dir) without --resume; to start over, "
      "use another --output-dir");
  if (r.mode == config::ResumeMode::kAuto) {
    FSDP_LOG0(kInfo) << "--resume auto: no complete checkpoint in " << r.output_dir
                     << ", starting fresh";
  }
  // A fresh run never overwrites an earlier run's checkpoints (its saves would replace them
  // name by name, and a later --resume would continue a mix of the two).
  if (r.mode == config::ResumeMode::kNone && !r.eval_only && !r.output_dir.empty()) {
    const auto earlier = checkpoint::find_latest(r.output_dir);
    FSDP_USAGE_CHECK(!earlier,
                     "--output-dir " + r.output_dir +
                         " already holds checkpoints of a run (the newest: " +
                         (earlier ? earlier->path : std::string()) +
                         "), and this run starts fresh: its saves would overwrite them",
                     "pass --resume to continue that run, --init-checkpoint " +
                         (earlier ? earlier->path : std::string("DIR")) +
                         " to start from its weights, or choose another --output-dir");
  }
}

}  // namespace

ResumePlan plan_resume(const ResumeRequest& r, const ResumeAgreement& agree) {
  ResumePlan plan;
  Refs& candidates = plan.candidates;
  Refs own = own_launch_checkpoints(r, agree);
  const bool restarting = !own.empty();
  plan.falls_back = restarting || r.mode == config::ResumeMode::kAuto;
  if (r.mode == config::ResumeMode::kAuto) {
    candidates = checkpoint::list_complete(r.output_dir);
    std::reverse(candidates.begin(), candidates.end());
  } else if (r.mode == config::ResumeMode::kPath) {
    candidates.push_back(requested_path(r, restarting));
  }
  // This launch's checkpoints first, then the first attempt's starting points (not twice).
  if (restarting) {
    for (const auto& c : candidates) {
      const bool dup =
          std::any_of(own.begin(), own.end(), [&](const auto& o) { return o.path == c.path; });
      if (!dup) own.push_back(c);
    }
    candidates = own;
  }
  agree.check_same(candidates);
  if (plan.falls_back) candidates = readable_candidates(candidates, r, agree);
  if (candidates.empty()) check_fresh_start(r);
  return plan;
}

bool inside_output_dir(const std::string& checkpoint_dir, const std::string& output_dir) {
  std::error_code ec;
  const auto parent = std::filesystem::absolute(checkpoint_dir, ec).lexically_normal();
  return !output_dir.empty() &&
         std::filesystem::equivalent(
             (parent.has_filename() ? parent : parent.parent_path()).parent_path(), output_dir, ec);
}

}  // namespace fsdp::train
