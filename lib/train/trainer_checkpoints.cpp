// The Trainer's checkpoints (train/trainer.h): saving one with every rank agreeing on the
// outcome, choosing what a run resumes from (restarts, fallbacks, branches set aside) and
// loading it. Never writes outside --output-dir; every collective here runs on every rank.
#include "train/trainer.h"
#include "train/trainer_impl.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "config/options.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/vocab_mapping.h"
#include "metrics/sinks.h"
#include "model/draft_model.h"
#include "shard/engine.h"
#include "train/run_state.h"
#include "train/signals.h"
#include "train/step_metrics.h"

namespace fsdp::train {

void Trainer::Impl::check_same_architecture(const std::string& saved_config,
                                            const std::string& flag) const {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(saved_config, ec)) return;  // weights-only exports
  const model::DraftConfig saved = model::load_draft_config(saved_config);
  const model::DraftConfig& now = draft_cfg;
  // Keys that give the weights their shapes: a difference is an error naming them. Others change
  // what the weights compute (RoPE, norm epsilon): a warning.
  std::string shape_diff, other_diff;
  const auto cmp = [](std::string& out, const char* key, const auto& a, const auto& b) {
    if (a != b) out += fsdp::str(out.empty() ? "" : ", ", key, " ", a, " vs ", b);
  };
  cmp(shape_diff, "hidden_size", saved.hidden_size, now.hidden_size);
  cmp(shape_diff, "intermediate_size", saved.intermediate_size, now.intermediate_size);
  cmp(shape_diff, "num_attention_heads", saved.num_attention_heads, now.num_attention_heads);
  cmp(shape_diff, "num_key_value_heads", saved.num_key_value_heads, now.num_key_value_heads);
  cmp(shape_diff, "head_dim", saved.head_dim_value(), now.head_dim_value());
  cmp(shape_diff, "vocab_size", saved.vocab_size, now.vocab_size);
  cmp(shape_diff, "draft_vocab_size", saved.draft_vocab(), now.draft_vocab());
  cmp(shape_diff, "target hidden size (fc input / 3)", saved.fc_in_features() / 3,
      now.fc_in_features() / 3);
  cmp(other_diff, "rms_norm_eps", saved.rms_norm_eps, now.rms_norm_eps);
  cmp(other_diff, "rope_theta", saved.rope_theta, now.rope_theta);
  cmp(other_diff, "rope_scaling", saved.rope_scaling_json, now.rope_scaling_json);
  cmp(other_diff, "max_position_embeddings", saved.max_position_embeddings,
      now.max_position_embeddings);
  cmp(other_diff, "hidden_act", saved.hidden_act, now.hidden_act);
  FSDP_USAGE_CHECK(shape_diff.empty(),
                   flag + ": the checkpoint's draft (" + saved_config +
                       ") and --draft-model-config " + cfg.model.draft_model_config +
                       " differ in " + shape_diff,
                   "use the draft config the checkpoint was trained with");
  if (!other_diff.empty()) {
    FSDP_LOG0(kWarn) << flag << ": the checkpoint's draft config (" << saved_config
                     << ") and --draft-model-config differ in " << other_diff
                     << " (checkpoint vs now); the weights load, but compute differently";
  }
}

bool Trainer::Impl::any_rank(bool mine) const {
  return comm::any_rank(*control, mine);
}

std::string Trainer::Impl::save(int64_t epoch_for_name) {
  Stopwatch w;
  checkpoint::CheckpointWriter writer(cfg.checkpoint.output_dir, epoch_for_name, state.step);
  // A write that fails (full disk, file size limit) on any rank fails the save on every rank:
  // the collective steps still run everywhere, then the ranks agree, and the partial directory
  // goes while the earlier checkpoints stay.
  std::string error;
  auto attempt = [&](const auto& write) {
    if (!error.empty()) return;
    try {
      write();
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  };
  if (rank == 0) attempt([&] { writer.begin(); });
  control->barrier();
  // The export leaves out the frozen embedding (spec 7): it is neither gathered nor copied (for
  // the llama3-8B draft 2.1 GB of fp32 on the device and on rank 0's host per save).
  auto full = engine->full_state(/*rank0_only=*/true, /*include_frozen=*/false);
  if (rank == 0) {
    attempt([&] {
      checkpoint::write_draft_export(writer.temp_dir(), draft_cfg.to_json(), full, mapping.d2t,
                                     mapping.t2d, to_dtype(cfg.checkpoint.export_dtype));
    });
  }
  full.clear();  // not held through save_state's own host copies (1.7 GB for the llama3-8B draft)
  try {          // collective: every rank enters it, also after an error of its own
    shard::save_state(*engine, checkpoint::join_path(writer.temp_dir(), "train_state"));
  } catch (const std::exception& e) {
    if (error.empty()) error = error_text(e);
  }
  if (rank == 0) attempt([&] { save_run_state(writer.temp_dir(), state); });
  bool failed = any_rank(!error.empty());
  if (!failed && rank == 0) attempt([&] { writer.commit(/*keep_last=*/0); });
  if (!failed) failed = any_rank(!error.empty());
  // Pruning older checkpoints after the new one is complete: a failure is only a warning.
  if (!failed && rank == 0 && cfg.checkpoint.keep_last > 0) {
    try {
      checkpoint::prune(cfg.checkpoint.output_dir, cfg.checkpoint.keep_last, writer.final_dir());
    } catch (const std::exception& e) {
      FSDP_LOG(kWarn) << "after saving " << writer.final_dir() << ", removing older checkpoints "
                      << "(--keep-last) failed: " << error_text(e);
    }
  }
  if (failed) {
    if (!error.empty()) {
      FSDP_LOG(kError) << "rank " << rank << ": the checkpoint of step " << state.step
                       << " could not be written: " << error;
    }
    if (rank == 0) {
      remove_tree(writer.temp_dir());
      FSDP_LOG0(kWarn) << "checkpoint of step " << state.step << " NOT saved (see the error "
                       << "above; free space in " << cfg.checkpoint.output_dir
                       << "); training goes on and the next save tries again; "
                       << newest_checkpoint_text();
    }
    control->barrier();
    return "";
  }
  if (rank == 0) {
    FSDP_LOG0(kInfo) << "saved checkpoint " << writer.final_dir() << " (" << w.seconds() << " s)";
  }
  control->barrier();
  return writer.final_dir();
}

std::string Trainer::Impl::newest_checkpoint_text() const {
  const auto latest = checkpoint::find_latest(cfg.checkpoint.output_dir);
  return latest
             ? "the newest complete checkpoint is " + latest->path + " (--resume continues from it)"
             : std::string("there is no complete checkpoint");
}

bool Trainer::Impl::inside_output_dir(const std::string& checkpoint_dir) const {
  // The same directory, however spelled (relative, trailing '/', symbolic links).
  std::error_code ec;
  const auto parent = std::filesystem::absolute(checkpoint_dir, ec).lexically_normal();
  return !cfg.checkpoint.output_dir.empty() &&
         std::filesystem::equivalent(
             (parent.has_filename() ? parent : parent.parent_path()).parent_path(),
             cfg.checkpoint.output_dir, ec);
}

void Trainer::Impl::check_same_checkpoints(
    const std::vector<checkpoint::CheckpointRef>& list) const {
  // Every rank must see the same checkpoints (one --output-dir shared by all): count and step
  // sum agree (the max of each and of its negation).
  int64_t step_sum = 0;
  for (const auto& c : list) step_sum += c.step;
  at::Tensor seen = at::tensor({static_cast<int64_t>(list.size()), step_sum}, at::kLong);
  at::Tensor low = -seen;
  control->all_reduce(seen, comm::ReduceOp::kMax)->wait();
  control->all_reduce(low, comm::ReduceOp::kMax)->wait();
  FSDP_USAGE_CHECK(at::equal(seen, -low),
                   "--resume: the ranks see different checkpoints in " + cfg.checkpoint.output_dir,
                   "--output-dir must be one directory shared by every rank");
}

void Trainer::Impl::plan_resume() {
  // Candidates, newest first: --resume auto falls back to older complete checkpoints when the
  // newest cannot be loaded (a damaged file); --resume PATH takes that one only.
  std::vector<checkpoint::CheckpointRef>& candidates = resume_candidates;
  candidates.clear();
  // A restart by the launcher continues from the newest checkpoint of its own launch (the
  // output directory may hold older runs' checkpoints), then falls back to where the first
  // attempt started; before this launch saved any, it starts the way the first attempt did.
  // Which checkpoints are the launch's is agreed: a rank that cannot read one's state says no.
  const LaunchAttempt launch = launch_attempt();
  std::vector<checkpoint::CheckpointRef> own;
  if (launch.attempt > 0 && !launch.launch_id.empty()) {
    const auto listing = checkpoint::list_complete(cfg.checkpoint.output_dir);
    check_same_checkpoints(listing);  // one agreement per checkpoint follows
    for (const auto& c : listing) {
      bool mine = false;
      try {
        mine = load_run_state(c.path, /*restore_rng=*/false).launch_id == launch.launch_id;
      } catch (const std::exception&) {
        // Unreadable state: not a candidate (the loading loop would only fail on it).
      }
      if (!any_rank(!mine)) own.push_back(c);
    }
    std::reverse(own.begin(), own.end());
    FSDP_LOG0(kWarn) << "restart " << launch.attempt << " of launch " << launch.launch_id << ": "
                     << (own.empty()
                             ? "no checkpoint of this launch yet, starting as the first attempt did"
                             : "resuming from " + own.front().path);
  }
  const bool restarting = !own.empty();
  resume_falls_back = restarting || cfg.checkpoint.resume == config::ResumeMode::kAuto;
  if (cfg.checkpoint.resume == config::ResumeMode::kAuto) {
    candidates = checkpoint::list_complete(cfg.checkpoint.output_dir);
    std::reverse(candidates.begin(), candidates.end());
  } else if (cfg.checkpoint.resume == config::ResumeMode::kPath) {
    const std::string dir = cfg.checkpoint.resume_path;
    const bool export_only = std::filesystem::is_regular_file(dir + "/model.safetensors") &&
                             !checkpoint::is_complete(dir) &&
                             !std::filesystem::exists(dir + "/train_state");
    FSDP_USAGE_CHECK(checkpoint::is_complete(dir),
                     "--resume " + dir + ": not a complete checkpoint directory (no " +
                         checkpoint::kCompleteMarker + " marker)",
                     export_only
                         ? "it holds weights only (a SpecForge checkpoint or an export), no "
                           "optimizer state to resume: start from its weights with "
                           "--init-checkpoint " +
                               dir + " (or --ckpt-dir) instead of --resume"
                     : std::filesystem::exists(dir + "/train_state")
                         ? "its save was interrupted (the marker is written last), so its files "
                           "may be incomplete: resume from an older checkpoint, or --resume auto"
                         : "point --resume at an epoch_<E>_step_<S> directory, or use --resume "
                           "auto");
    // Continuing a checkpoint of another directory: this run's saves must not mix with a run
    // whose checkpoints are in --output-dir.
    if (!restarting && !cfg.loop.eval_only && !inside_output_dir(dir)) {
      const auto other = checkpoint::find_latest(cfg.checkpoint.output_dir);
      FSDP_USAGE_CHECK(!other,
                       "--resume " + dir + " is outside --output-dir " + cfg.checkpoint.output_dir +
                           ", which holds checkpoints of another run "
                           "(the newest: " +
                           (other ? other->path : std::string()) +
                           "): the two runs' checkpoints would mix",
                       "continue into an empty --output-dir, or resume a checkpoint of " +
                           cfg.checkpoint.output_dir);
    }
    checkpoint::CheckpointRef ref;
    ref.path = dir;
    candidates.push_back(ref);
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
  check_same_checkpoints(candidates);
  // With fallback, a checkpoint whose weights file or config cannot be read (damaged after the
  // save) is passed over like one whose training state cannot be loaded. Agreed over ranks.
  if (resume_falls_back) {
    std::vector<checkpoint::CheckpointRef> readable;
    for (const auto& c : candidates) {
      std::string problem;
      try {
        const auto [d2t, t2d] = checkpoint::read_export_mapping(c.path);
        if (!d2t.defined() || !t2d.defined()) problem = "model.safetensors has no d2t/t2d";
        const std::string config = checkpoint::join_path(c.path, "config.json");
        if (std::filesystem::is_regular_file(config)) model::load_draft_config(config);
      } catch (const std::exception& e) {
        problem = error_text(e);
      }
      if (!any_rank(!problem.empty())) {
        readable.push_back(c);
      } else {
        FSDP_LOG0(kWarn) << "checkpoint " << c.path << " cannot be resumed"
                         << (problem.empty() ? " (on another rank)" : ": " + problem)
                         << "; trying the next older one";
      }
    }
    FSDP_USAGE_CHECK(candidates.empty() || !readable.empty(),
                     "--resume: no checkpoint in " + cfg.checkpoint.output_dir +
                         " can be read (see the warnings above)",
                     "check the files named above; to start over use another --output-dir");
    candidates = readable;
  }
  if (candidates.empty()) {
    // Never start over silently next to another trainer's checkpoints: that run's epochs would
    // look resumed and be lost.
    // (--init-checkpoint says where to start.)
    const auto foreign =
        cfg.checkpoint.resume == config::ResumeMode::kAuto && cfg.model.init_checkpoint.empty()
            ? checkpoint::list_foreign_exports(cfg.checkpoint.output_dir)
            : std::vector<std::string>{};
    std::string names;
    for (size_t i = 0; i < foreign.size() && i < 3; ++i) names += (i ? ", " : "") + foreign[i];
    if (foreign.size() > 3) names += ", ...";
    FSDP_USAGE_CHECK(
        foreign.empty(),
        "--resume: " + cfg.checkpoint.output_dir + " has no fsdp-train checkpoint to resume, but " +
            std::to_string(foreign.size()) + " draft checkpoint(s) without optimizer state (" +
            names + "), e.g. from SpecForge",
        "to continue from those weights with a fresh optimizer and schedule, pass "
        "--init-checkpoint <that directory> (or --ckpt-dir) without --resume; to start over, "
        "use another --output-dir");
    if (cfg.checkpoint.resume == config::ResumeMode::kAuto) {
      FSDP_LOG0(kInfo) << "--resume auto: no complete checkpoint in " << cfg.checkpoint.output_dir
                       << ", starting fresh";
    }
    // A fresh run never overwrites an earlier run's checkpoints (its saves would replace them
    // name by name, and a later --resume would continue a mix of the two).
    if (cfg.checkpoint.resume == config::ResumeMode::kNone && !cfg.loop.eval_only &&
        !cfg.checkpoint.output_dir.empty()) {
      const auto earlier = checkpoint::find_latest(cfg.checkpoint.output_dir);
      FSDP_USAGE_CHECK(!earlier,
                       "--output-dir " + cfg.checkpoint.output_dir +
                           " already holds checkpoints of a run (the newest: " +
                           (earlier ? earlier->path : std::string()) +
                           "), and this run starts fresh: its saves would overwrite them",
                       "pass --resume to continue that run, --init-checkpoint " +
                           (earlier ? earlier->path : std::string("DIR")) +
                           " to start from its weights, or choose another --output-dir");
    }
  }
}

void Trainer::Impl::report_changed_settings(const std::string& saved_json) const {
  // Settings that change what a step computes: a resume may change them on purpose (a lower
  // learning rate, a longer unroll), but never silently.
  static const char* const kKeys[] = {"draft_global_batch_size",
                                      "learning_rate",
                                      "lr_scheduler",
                                      "warmup_ratio",
                                      "warmup_steps",
                                      "max_grad_norm",
                                      "adam_beta1",
                                      "adam_beta2",
                                      "adam_eps",
                                      "weight_decay",
                                      "ttt_length",
                                      "max_length",
                                      "loss_normalization",
                                      "mixed_precision",
                                      "reduce_dtype",
                                      "seed",
                                      "train_hidden_states_path"};
  const auto saved = nlohmann::json::parse(saved_json, nullptr, /*allow_exceptions=*/false);
  const auto now = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object() || !now.is_object()) return;
  std::string changes;
  for (const char* key : kKeys) {
    if (!saved.contains(key) || !now.contains(key) || saved[key] == now[key]) continue;
    changes += fsdp::str(changes.empty() ? "" : ", ", key, " ", saved[key].dump(), " -> ",
                         now[key].dump());
  }
  if (!changes.empty()) {
    FSDP_LOG0(kWarn) << "resuming with settings that differ from the checkpoint's run: " << changes;
  }
}

void Trainer::Impl::resume_if_asked() {
  const std::vector<checkpoint::CheckpointRef>& candidates = resume_candidates;
  if (candidates.empty()) return;
  const bool fall_back = resume_falls_back;
  RunState saved;
  std::string loaded;
  for (size_t i = 0;; ++i) {
    const std::string& path = candidates[i].path;
    std::string error;
    try {
      saved = load_run_state(path);
      const std::string state_dir = checkpoint::join_path(path, "train_state");
      shard::load_state(*engine, state_dir);
      // trainer_state.json and the shard manifest were written by the same save: the optimizer
      // steps taken (the manifest's step) are the trainer's steps less the skipped ones.
      const int64_t manifest_step = engine->step_count();
      FSDP_USAGE_CHECK(manifest_step <= saved.step &&
                           manifest_step >= saved.step - std::max<int64_t>(saved.skipped_steps, 0),
                       fsdp::str(checkpoint::join_path(path, "trainer_state.json"), " says step ",
                                 saved.step, " (", saved.skipped_steps, " skipped), ",
                                 checkpoint::join_path(state_dir, "manifest.txt"), " says ",
                                 manifest_step, " optimizer steps: the checkpoint is damaged"),
                       "resume from an older checkpoint (--resume auto falls back to one)");
    } catch (const std::exception& e) {
      error = error_text(e);
    }
    if (!any_rank(!error.empty())) {
      loaded = path;
      break;
    }
    if (!error.empty()) {
      FSDP_LOG(kError) << "rank " << rank << ": cannot load checkpoint " << path << ": " << error;
    }
    // A checkpoint the user named (or the last one left) that cannot be loaded is a usage error
    // (exit 2) naming the file, whatever the reader threw.
    FSDP_USAGE_CHECK(i + 1 < candidates.size(),
                     "--resume: checkpoint " + path + " could not be loaded" +
                         (error.empty() ? std::string(" (on another rank: see its error above)")
                                        : ": " + error) +
                         (candidates.size() > 1 ? ", nor any older one" : ""),
                     !fall_back
                         ? "pick another checkpoint, or --resume auto (it falls back to older ones)"
                         : "check the files named above; to start over use another --output-dir");
    FSDP_LOG0(kWarn) << "checkpoint " << path << " could not be loaded ("
                     << (error.empty() ? std::string("on another rank, see the error above")
                                       : error)
                     << "): resuming from the next older one, " << candidates[i + 1].path;
  }
  // The mapping the model was built with came from the first candidate (build_model); a fallback
  // to an older checkpoint must mean the same vocabulary.
  if (loaded != candidates.front().path) {
    const auto [d2t, t2d] = checkpoint::read_export_mapping(loaded);
    FSDP_USAGE_CHECK(d2t.defined() && t2d.defined() && at::equal(d2t, mapping.d2t) &&
                         at::equal(t2d, mapping.t2d),
                     "--resume: " + loaded + " has another vocabulary mapping than " +
                         candidates.front().path + " (the checkpoints are of different runs)",
                     "resume one of them explicitly with --resume PATH");
  }
  // Checkpoints after the one resumed from belong to an abandoned branch: set aside, so that
  // this run's saves do not overwrite them and a later --resume auto does not take them.
  if (rank == 0 && !cfg.loop.eval_only && inside_output_dir(loaded)) {
    for (const auto& moved : checkpoint::set_aside_newer(cfg.checkpoint.output_dir, saved.step)) {
      FSDP_LOG0(kWarn) << "resumed from step " << saved.step << ": the newer checkpoint is set "
                       << "aside as " << moved << " (another branch of the run; nothing deleted)";
    }
  }
  control->barrier();
  if (have_init_export && rank == 0) {
    FSDP_LOG0(kWarn) << "--init-checkpoint " << cfg.model.init_checkpoint
                     << " is not used: the run resumes from " << loaded;
  }
  state = saved;
  state.config_json = config_json;  // later checkpoints record this run's settings
  if (!cfg.loop.eval_only) report_changed_settings(saved.config_json);
  if (saved.world_size != world || saved.micro_batch_size != plan.micro_batch) {
    // Different data-parallel layout: keep the number of samples consumed in the epoch.
    const int64_t samples = saved.position * saved.micro_batch_size * saved.world_size;
    const int64_t per_round = plan.micro_batch * world;  // samples of one micro-batch per rank
    state.position = samples / per_round;
    const int64_t resumed_at = state.position * per_round;
    if (!cfg.loop.eval_only) {  // an evaluation has no data position
      FSDP_LOG0(kWarn)
          << "resuming a run saved at " << saved.world_size << " rank(s) x micro-batch "
          << saved.micro_batch_size << " on " << world << " x " << plan.micro_batch << ": "
          << (saved.world_size != world ? "parameters and optimizer state are resharded exactly; "
                                        : "")
          << "the data order continues at sample " << resumed_at << " of epoch " << saved.epoch
          << (resumed_at == samples
                  ? std::string()
                  : fsdp::str(" (the checkpoint had consumed ", samples, ", not a multiple of ",
                              per_round, " = ranks x micro-batch: samples ", resumed_at, "..",
                              samples - 1, " are trained again)"));
    }
  }
  state.world_size = world;
  state.accumulation_steps = plan.accumulation_steps;
  state.micro_batch_size = plan.micro_batch;
  FSDP_LOG0(kInfo) << "resumed from " << loaded << " at step " << state.step << " (epoch "
                   << state.epoch << ", micro-batch " << state.position << ")";
}

}  // namespace fsdp::train
