// EAGLE3 behind the algorithm seam (train/algo/eagle3.h): the draft, its target head and
// vocabulary mapping, the TTT step, and what its checkpoints export.
#include "train/algo/eagle3.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <filesystem>

#include "checkpoint/export.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/log.h"
#include "model/aux_layers.h"
#include "model/flops.h"
#include "model/memory_estimate.h"
#include "model/seq_parallel.h"
#include "shard/engine.h"
#include "train/algo/eagle3_metrics.h"
#include "train/algo/eagle_family.h"
#include "train/algo/target_tensors.h"
#include "train/component_options.h"

namespace fsdp::algo {

namespace {

// The loss rows of a micro-batch from its host loss mask (model::LossRows::build: no device
// sync); a sequence-parallel slice's from the whole sample's mask (LossRows::build_shard).
model::LossRows batch_rows(const data::Batch& b, int64_t ttt_length, c10::Device device) {
  if (b.sharded()) {
    return model::LossRows::build_shard(b.full_loss_mask, ttt_length, device, b.shard_offset,
                                        b.shard_local);
  }
  return model::LossRows::build(b.loss_mask, ttt_length, device, b.documents);
}

// Model FLOPs of one training micro-batch over real tokens only (padding is neither throughput
// nor model FLOPs).
double step_flops(const model::DraftConfig& dc, const model::LossRows& rows, const data::Batch& b,
                  const model::LossOptions& loss) {
  const int64_t T = loss.ttt_length;
  if (b.sharded()) {
    // The group computes the sample's decoder layers together (each rank its positions, and
    // heads / P of the attention over all of them) and the head on its own loss rows.
    const int64_t P = loss.seq_group ? loss.seq_group->size() : 1;
    const std::vector<int64_t> whole{rows.shard_total};
    const auto with_rows = model::count_step_flops(dc, whole, T, rows.count);
    const auto without =
        model::count_step_flops(dc, whole, T, std::vector<int64_t>(static_cast<size_t>(T), 0));
    return without.total() / static_cast<double>(P) + (with_rows.total() - without.total());
  }
  std::vector<int64_t> lengths = b.documents;
  if (lengths.empty()) {
    const at::Tensor valid = b.attention_mask.sum(1).to(at::kLong).contiguous();
    const int64_t* v = valid.data_ptr<int64_t>();
    lengths.assign(v, v + valid.numel());
  }
  return model::count_step_flops(dc, lengths, T, rows.count).total();
}

}  // namespace

Eagle3::Eagle3(const Context& ctx)
    : ctx_(ctx),
      cfg_(*ctx.cfg),
      draft_cfg_(model::load_draft_config(cfg_.model.draft_model_config)),
      train_loss_(train::loss_options(cfg_, ctx.accumulation, ctx.seq_group)),
      eval_loss_(train::loss_options(cfg_, 1, ctx.seq_group)),
      schema_(std::make_unique<Eagle3Metrics>(cfg_.model.ttt_length,
                                              cfg_.metrics.accuracy_aggregation)) {}

Eagle3::~Eagle3() = default;

void Eagle3::check_supported() const {
  if (cfg_.model.lora_rank > 0)
    model::check_lora_rank(draft_cfg_, cfg_.model.lora_rank, cfg_.model.lora_targets);
  const int64_t sp = cfg_.loop.sp_ulysses_size;
  if (sp > 1) {
    // Ulysses gives each rank of a group heads / sp attention heads and key/value heads.
    FSDP_USAGE_CHECK(
        draft_cfg_.num_attention_heads % sp == 0 && draft_cfg_.num_key_value_heads % sp == 0,
        fsdp::str("--sp-ulysses-size ", sp, ": the draft (", cfg_.model.draft_model_config,
                  ") has ", draft_cfg_.num_attention_heads, " attention and ",
                  draft_cfg_.num_key_value_heads,
                  " key/value heads; each must be a multiple of it"),
        "choose a sequence-parallel size that divides both head counts (the "
        "llama3-8B draft: 1, 2, 4 or 8)");
  }
}

void Eagle3::plan_serving() {
  serving_ = plan_eagle_serving(cfg_, draft_cfg_, cfg_.checkpoint.export_for, ctx_.is_root);
}

void Eagle3::check_memory(const model::MemoryPlan& plan, uint64_t available,
                          const std::string& where) const {
  model::check_training_memory(draft_cfg_, plan, available, where);
}

data::DatasetOptions Eagle3::dataset_options() const {
  return eagle_dataset_options(draft_cfg_);
}

void Eagle3::check_dataset(const data::FeatureDataset& ds, const std::string& flag) const {
  check_captured_layers(ds, flag, serving_.aux_layers);
}

void Eagle3::check_same_architecture(const std::string& saved_config,
                                     const std::string& flag) const {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(saved_config, ec)) return;  // weights-only exports
  const model::DraftConfig saved = model::load_draft_config(saved_config);
  const model::DraftConfig& now = draft_cfg_;
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
  cmp(shape_diff, "architectures (Qwen3 layers' q_norm/k_norm)", saved.architectures.at(0),
      now.architectures.at(0));
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
                       ") and --draft-model-config " + cfg_.model.draft_model_config +
                       " differ in " + shape_diff,
                   "use the draft config the checkpoint was trained with");
  if (!other_diff.empty()) {
    FSDP_LOG0(kWarn) << flag << ": the checkpoint's draft config (" << saved_config
                     << ") and --draft-model-config differ in " << other_diff
                     << " (checkpoint vs now); the weights load, but compute differently";
  }
}

void Eagle3::build(const WeightSources& weights, const data::FeatureDataset* train_ds) {
  const c10::Device& device = ctx_.device;
  mapping_ = choose_vocab_mapping(cfg_, draft_cfg_.vocab_size, draft_cfg_.draft_vocab(), weights,
                                  train_ds, ctx_.control);
  const TargetTensors target = read_target_tensors(
      cfg_, TargetShape{draft_cfg_.vocab_size, draft_cfg_.target_hidden(), draft_cfg_.hidden_size});
  head_ = model::TargetHead(target.lm_head.to(c10::kBFloat16), mapping_.t2d);
  head_.to(device);
  // Identical initial weights on every rank: same seed before construction.
  torch::manual_seed(static_cast<uint64_t>(cfg_.loop.seed));
  draft_ = model::Eagle3Draft(draft_cfg_);
  if (cfg_.model.draft_init == config::DraftInit::kNormal)
    draft_->normal_init(draft_cfg_.initializer_range);
  draft_->load_embedding(target.embedding);
  draft_->set_vocab_mapping(mapping_.d2t, mapping_.t2d);
  draft_->set_checkpoint_layer(cfg_.model.activation_checkpointing);
  // --fused-cuda-kernels: the TTT steps' weight gradients summed inside their GEMMs (a
  // checkpointed layer recomputes and differentiates each step on its own: nothing to sum).
  draft_->set_weight_grad_in_place(cfg_.model.fused_cuda_kernels &&
                                   !cfg_.model.activation_checkpointing);
  if (cfg_.model.lora_rank > 0) enable_lora(weights);
  draft_->to(device);

  shard::EngineOptions eo = train::engine_options(cfg_, device);
  eo.units = draft_->unit_names();  // one unit per decoder layer of a multi-layer draft
  eo.validate();
  auto groups = shard::make_comm_groups(eo.strategy, device);
  engine_ = std::make_unique<shard::ShardEngine>(*draft_, groups, eo);
  draft_->set_unit_hooks(engine_.get());
  if (weights.init) load_init_weights(*weights.init);
}

void Eagle3::enable_lora(const WeightSources& weights) {
  // Before the engine exists: it puts the frozen base into its frozen buffers (no masters, no
  // optimizer state) and only the adapters into the trainable ones.
  FSDP_USAGE_CHECK(weights.init != nullptr,
                   "--lora-rank adapts an existing draft, and no --init-checkpoint is given",
                   "give --init-checkpoint BASE (an exported draft), or drop --lora-rank to "
                   "train the whole draft");
  draft_->enable_lora(cfg_.model.lora_rank, cfg_.model.lora_alpha, cfg_.model.lora_targets);
  int64_t adapters = 0, frozen = 0;
  for (const auto& p : draft_->named_parameters())
    (p.value().requires_grad() ? adapters : frozen) += p.value().numel();
  std::string targets;
  for (const auto t : cfg_.model.lora_targets)
    targets += (targets.empty() ? "" : ",") + std::string(model::lora_target_name(t));
  FSDP_LOG0(kInfo) << "LoRA: rank " << cfg_.model.lora_rank << ", alpha " << cfg_.model.lora_alpha
                   << " (scale "
                   << cfg_.model.lora_alpha / static_cast<double>(cfg_.model.lora_rank) << ") on "
                   << targets << " of " << draft_->num_layers() << " layer(s): " << adapters
                   << " adapter parameters trained, " << frozen << " frozen (the base of "
                   << cfg_.model.init_checkpoint << "); checkpoints export the merged draft";
}

void Eagle3::load_init_weights(const checkpoint::DraftExport& init) {
  std::map<std::string, at::Tensor> weights(init.weights.begin(), init.weights.end());
  for (const auto& item : draft_->named_parameters()) {
    const std::string& name = item.key();
    // LoRA adapters start fresh (B = 0: the adapted draft starts as the base).
    if (name == "embed_tokens.weight" || model::is_lora_tensor(name)) continue;
    FSDP_USAGE_CHECK(
        weights.count(name),
        fsdp::str("--init-checkpoint ", cfg_.model.init_checkpoint, " lacks tensor '", name, "'"),
        "use an export written by fsdp-train (or SpecForge) for this draft config");
    FSDP_USAGE_CHECK(all_finite(weights.at(name)),
                     fsdp::str("--init-checkpoint ", cfg_.model.init_checkpoint, ": tensor '", name,
                               "' contains NaN or Inf values"),
                     "start from an earlier checkpoint of that run");
  }
  engine_->load_full_state(weights, /*allow_missing=*/true);
}

std::string Eagle3::describe_parameters() const {
  const auto counts = model::count_parameters(draft_cfg_);
  int64_t trained = 0;  // the LoRA adapters alone with --lora-rank
  for (const auto& p : draft_->trainable_parameters()) trained += p.numel();
  return fsdp::str(
      trained, " trainable parameters (+", counts.frozen_embedding, " frozen embedding",
      draft_->lora_enabled() ? fsdp::str(", ", counts.trainable, " frozen base weights")
                             : std::string(),
      ")");
}

MicroBatchResult Eagle3::forward(const data::Batch& b, bool training) {
  const model::LossOptions& loss = training ? train_loss_ : eval_loss_;
  const c10::Device& device = ctx_.device;
  // Loss rows from the host copy of loss_mask: no device sync (see model::LossRows).
  const auto rows = batch_rows(b, loss.ttt_length, device);
  MicroBatchResult r;
  if (training) r.flops = step_flops(draft_cfg_, rows, b, loss);
  model::StepOutput out =
      model::ttt_step(*draft_, head_, rows, b.input_ids.to(device, true),
                      b.attention_mask.to(device, true), b.loss_mask.to(device, true),
                      b.aux_hidden.to(device, true), b.target_hidden.to(device, true), loss);
  r.sums = static_cast<const Eagle3Metrics&>(*schema_).row(out);
  r.loss = std::move(out.loss);
  return r;
}

checkpoint::CheckpointExport Eagle3::checkpoint_export() const {
  checkpoint::CheckpointExport e;
  e.config_json = serving_.config_json(draft_cfg_.to_json());
  e.d2t = mapping_.d2t;
  e.t2d = mapping_.t2d;
  e.dtype = train::to_dtype(cfg_.checkpoint.export_dtype);
  if (draft_->lora_enabled()) {
    e.lora = checkpoint::LoraRecord{cfg_.model.lora_rank, cfg_.model.lora_alpha,
                                    model::lora_target_names(cfg_.model.lora_targets),
                                    cfg_.model.init_checkpoint};
    e.lora_adapters = cfg_.checkpoint.export_lora_adapters;
  }
  if (serving_.aux_layers) e.aux_layers_record = model::aux_layers_record(*serving_.aux_layers);
  return e;
}

void Eagle3::check_resume_fallback(const std::string& loaded, const std::string& newest) const {
  // The mapping the model was built with came from the newest candidate (build); a fallback to
  // an older checkpoint must mean the same vocabulary.
  const auto [d2t, t2d] = checkpoint::read_export_mapping(loaded);
  FSDP_USAGE_CHECK(d2t.defined() && t2d.defined() && at::equal(d2t, mapping_.d2t) &&
                       at::equal(t2d, mapping_.t2d),
                   "--resume: " + loaded + " has another vocabulary mapping than " + newest +
                       " (the checkpoints are of different runs)",
                   "resume one of them explicitly with --resume PATH");
}

}  // namespace fsdp::algo
