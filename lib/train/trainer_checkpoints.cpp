// The Trainer's side of its checkpoints (train/trainer.h): what a save writes (the export, the
// sharded state, the run state; Checkpointer runs the agreed save), and resuming from what the
// checkpointer loads (the same vocabulary, another data-parallel layout, changed settings).
// Never writes outside --output-dir; every collective here runs on every rank.
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
#include "metrics/sinks.h"
#include "shard/engine.h"
#include "train/component_options.h"
#include "train/resume_plan.h"
#include "train/run_state.h"
#include "train/signals.h"
#include "train/step_metrics.h"

namespace fsdp::train {

std::string Trainer::Impl::save(int64_t epoch_for_name) {
  std::string dir =
      checkpointer.save(epoch_for_name, state.step, [&](Checkpointer::SaveAttempt& s) {
        // The export leaves out the frozen embedding (docs/reference.md §7): it is neither gathered
        // nor copied (for the llama3-8B draft 2.1 GB of fp32 on the device and on rank 0's host per
        // save). A LoRA run exports the merged draft (docs/model.md "LoRA"): its frozen base
        // weights are gathered too (the embedding still is not), and the adapters folded into them.
        shard::ShardEngine& engine = algo->engine();
        auto full = algo->exports_frozen_base()
                        ? engine.full_state(/*rank0_only=*/true, /*include_frozen=*/true,
                                            /*skip_frozen_units=*/{"embed_tokens"})
                        : engine.full_state(/*rank0_only=*/true, /*include_frozen=*/false);
        s.on_root(
            [&] { checkpoint::write_checkpoint_export(s.dir(), full, algo->checkpoint_export()); });
        full.clear();  // not held through save_state's host copies (1.7 GB for the llama3-8B draft)
        s.on_every_rank([&] {
          shard::save_state(engine,
                            checkpoint::join_path(s.dir(), checkpoint::layout::kTrainState));
        });
        s.on_root([&] { save_run_state(s.dir(), state); });
        if (spool) s.on_root([&] { write_stream_record(s.dir()); });
      });
  // Complete on disk: the samples whose last use it covers may go.
  if (!dir.empty()) acknowledge_stream();
  return dir;
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

void Trainer::Impl::resume_if_asked() {
  const std::vector<checkpoint::CheckpointRef>& candidates = checkpointer.resume_candidates();
  if (candidates.empty()) return;
  const auto [saved, loaded] = checkpointer.load_first_loadable(algo->engine());
  // The model was built for the first candidate (build_model): a fallback to an older
  // checkpoint must mean the same to it.
  if (loaded != candidates.front().path)
    algo->check_resume_fallback(loaded, candidates.front().path);
  checkpointer.set_aside_newer(loaded, saved.step);
  topo.control().barrier();
  if (have_init_export && topo.is_root()) {
    FSDP_LOG0(kWarn) << "--init-checkpoint " << cfg.model.init_checkpoint
                     << " is not used: the run resumes from " << loaded;
  }
  state = saved;
  state.config_json = config_json;  // later checkpoints record this run's settings
  if (!cfg.loop.eval_only) report_changed_settings(saved.config_json);
  if (saved.world_size != topo.dp_world() || saved.micro_batch_size != plan.micro_batch) {
    adopt_layout(saved);
  }
  state.world_size = topo.dp_world();
  state.accumulation_steps = plan.accumulation_steps;
  state.micro_batch_size = plan.micro_batch;
  FSDP_LOG0(kInfo) << "resumed from " << loaded << " at step " << state.step << " (epoch "
                   << state.epoch << ", micro-batch " << state.position << ")";
  if (spool) check_stream_resume(loaded);
  if (cfg.checkpoint.reset_optimizer_state) {
    FSDP_LOG0(kInfo) << "--reset-optimizer-state: the " << config::to_string(cfg.optim.optimizer)
                     << " state starts fresh at step " << state.step;
  }
}

void Trainer::Impl::adopt_layout(const RunState& saved) {
  // Different data-parallel layout: keep the number of samples consumed in the epoch.
  const int64_t samples = saved.position * saved.micro_batch_size * saved.world_size;
  // Samples of one micro-batch per data-parallel rank (a sequence-parallel group reads one).
  const int dp_world = topo.dp_world();
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
