// The Trainer's checkpoints (train/trainer.h): saving one with every rank agreeing on the
// outcome, and loading what resume_plan.h chose (fallbacks, branches set aside, another
// data-parallel layout). Never writes outside --output-dir; every collective here runs on every
// rank.
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
#include "train/component_options.h"
#include "train/resume_plan.h"
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
  cmp(shape_diff, "target hidden size", saved.target_hidden(), now.target_hidden());
  cmp(shape_diff, "captured target layers (num_aux_hidden_states)", saved.num_aux_hidden_states,
      now.num_aux_hidden_states);
  cmp(shape_diff, "decoder layers (num_hidden_layers)", saved.num_hidden_layers,
      now.num_hidden_layers);
  cmp(shape_diff, "fc_norm", saved.fc_norm, now.fc_norm);
  cmp(shape_diff, "norm_before_fc", saved.norm_before_fc, now.norm_before_fc);
  cmp(other_diff, "norm_output", saved.norm_output, now.norm_output);
  cmp(other_diff, "norm_before_residual", saved.norm_before_residual, now.norm_before_residual);
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
  // The export leaves out the frozen embedding (docs/reference.md §7): it is neither gathered nor
  // copied (for the llama3-8B draft 2.1 GB of fp32 on the device and on rank 0's host per save).
  // A LoRA run exports the merged draft (docs/model.md "LoRA"): its frozen base weights are
  // gathered too (the embedding still is not), and the adapters folded into them.
  const bool lora = draft->lora_enabled();
  auto full = lora ? engine->full_state(/*rank0_only=*/true, /*include_frozen=*/true,
                                        /*skip_frozen_units=*/{"embed_tokens"})
                   : engine->full_state(/*rank0_only=*/true, /*include_frozen=*/false);
  if (rank == 0) {
    attempt([&] {
      if (lora) {
        checkpoint::LoraRecord rec{cfg.model.lora_rank, cfg.model.lora_alpha,
                                   cfg.model.lora_targets, cfg.model.init_checkpoint};
        if (cfg.checkpoint.export_lora_adapters) {
          std::map<std::string, at::Tensor> adapters;
          for (const auto& [name, t] : full)
            if (model::is_lora_tensor(name)) adapters.emplace(name, t);
          checkpoint::write_peft_adapter(checkpoint::join_path(writer.temp_dir(), "adapter"),
                                         adapters, rec, to_dtype(cfg.checkpoint.export_dtype));
        }
        model::merge_lora(full, rec.scale());
        fsdp::write_file_durably(checkpoint::join_path(writer.temp_dir(), "lora.json"),
                                 checkpoint::lora_record_json(rec));
      }
      checkpoint::write_draft_export(writer.temp_dir(), export_config_json(), full, mapping.d2t,
                                     mapping.t2d, to_dtype(cfg.checkpoint.export_dtype));
      if (aux_layers) {
        // Inside the temporary directory: published with the checkpoint, never half-written.
        fsdp::write_file_durably(checkpoint::join_path(writer.temp_dir(), "aux_layers.json"),
                                 model::aux_layers_record(*aux_layers));
      }
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
    point_latest(writer.final_dir());
  }
  control->barrier();
  return writer.final_dir();
}

void Trainer::Impl::point_latest(const std::string& checkpoint_dir) const {
  // A convenience for people and scripts: resume never reads it (it lists the checkpoints), so a
  // link that cannot be made is only a warning.
  try {
    checkpoint::point_link(cfg.checkpoint.output_dir, checkpoint::kLatestLink, checkpoint_dir);
  } catch (const std::exception& e) {
    FSDP_LOG0(kWarn) << "<output-dir>/" << checkpoint::kLatestLink
                     << " not updated: " << error_text(e);
  }
}

std::string Trainer::Impl::newest_checkpoint_text() const {
  const auto latest = checkpoint::find_latest(cfg.checkpoint.output_dir);
  return latest
             ? "the newest complete checkpoint is " + latest->path + " (--resume continues from it)"
             : std::string("there is no complete checkpoint");
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
  ResumeRequest request;
  request.mode = cfg.checkpoint.resume;
  request.path = cfg.checkpoint.resume_path;
  request.output_dir = cfg.checkpoint.output_dir;
  request.eval_only = cfg.loop.eval_only;
  request.has_init_checkpoint = !cfg.model.init_checkpoint.empty();
  request.launch = launch_attempt();
  ResumeAgreement agree;
  agree.any_rank = [this](bool mine) { return any_rank(mine); };
  agree.check_same = [this](const auto& list) { check_same_checkpoints(list); };
  ResumePlan plan = train::plan_resume(request, agree);
  resume_candidates = std::move(plan.candidates);
  resume_falls_back = plan.falls_back;
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
                                      "noise_std",
                                      "noise_type",
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

std::pair<RunState, std::string> Trainer::Impl::load_first_loadable() {
  const std::vector<checkpoint::CheckpointRef>& candidates = resume_candidates;
  for (size_t i = 0;; ++i) {
    const std::string& path = candidates[i].path;
    std::string error;
    RunState saved;
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
    if (!any_rank(!error.empty())) return {saved, path};
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
                     !resume_falls_back
                         ? "pick another checkpoint, or --resume auto (it falls back to older ones)"
                         : "check the files named above; to start over use another --output-dir");
    FSDP_LOG0(kWarn) << "checkpoint " << path << " could not be loaded ("
                     << (error.empty() ? std::string("on another rank, see the error above")
                                       : error)
                     << "): resuming from the next older one, " << candidates[i + 1].path;
  }
}

void Trainer::Impl::resume_if_asked() {
  const std::vector<checkpoint::CheckpointRef>& candidates = resume_candidates;
  if (candidates.empty()) return;
  const auto [saved, loaded] = load_first_loadable();
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
  if (rank == 0 && !cfg.loop.eval_only && inside_output_dir(loaded, cfg.checkpoint.output_dir)) {
    const auto moved_aside = checkpoint::set_aside_newer(cfg.checkpoint.output_dir, saved.step);
    for (const auto& moved : moved_aside) {
      FSDP_LOG0(kWarn) << "resumed from step " << saved.step << ": the newer checkpoint is set "
                       << "aside as " << moved << " (another branch of the run; nothing deleted)";
    }
    if (!moved_aside.empty()) point_latest(loaded);  // the link named a checkpoint set aside
  }
  control->barrier();
  if (have_init_export && rank == 0) {
    FSDP_LOG0(kWarn) << "--init-checkpoint " << cfg.model.init_checkpoint
                     << " is not used: the run resumes from " << loaded;
  }
  state = saved;
  state.config_json = config_json;  // later checkpoints record this run's settings
  if (!cfg.loop.eval_only) report_changed_settings(saved.config_json);
  if (saved.world_size != dp_world || saved.micro_batch_size != plan.micro_batch) {
    adopt_layout(saved);
  }
  state.world_size = dp_world;
  state.accumulation_steps = plan.accumulation_steps;
  state.micro_batch_size = plan.micro_batch;
  FSDP_LOG0(kInfo) << "resumed from " << loaded << " at step " << state.step << " (epoch "
                   << state.epoch << ", micro-batch " << state.position << ")";
}

void Trainer::Impl::adopt_layout(const RunState& saved) {
  // Different data-parallel layout: keep the number of samples consumed in the epoch.
  const int64_t samples = saved.position * saved.micro_batch_size * saved.world_size;
  // Samples of one micro-batch per data-parallel rank (a sequence-parallel group reads one).
  const int64_t per_round = plan.micro_batch * dp_world;
  state.position = samples / per_round;
  const int64_t resumed_at = state.position * per_round;
  if (cfg.loop.eval_only) return;  // an evaluation has no data position
  FSDP_LOG0(kWarn)
      << "resuming a run saved at " << saved.world_size << " rank(s) x micro-batch "
      << saved.micro_batch_size << " on " << dp_world << " x " << plan.micro_batch << ": "
      << (saved.world_size != dp_world ? "parameters and optimizer state are resharded exactly; "
                                       : "")
      << "the data order continues at sample " << resumed_at << " of epoch " << saved.epoch
      << (resumed_at == samples
              ? std::string()
              : fsdp::str(" (the checkpoint had consumed ", samples, ", not a multiple of ",
                          per_round, " = ranks x micro-batch: samples ", resumed_at, "..",
                          samples - 1, " are trained again)"));
}

}  // namespace fsdp::train
