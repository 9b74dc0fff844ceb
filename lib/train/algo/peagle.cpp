// P-EAGLE behind the algorithm seam (train/algo/peagle.h).
#include "train/algo/peagle.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/hash.h"
#include "core/log.h"
#include "model/flops.h"
#include "model/peagle_acceptance.h"
#include "model/peagle_step.h"
#include "shard/engine.h"
#include "train/algo/eagle_family.h"
#include "train/algo/peagle_metrics.h"
#include "train/algo/target_tensors.h"
#include "train/component_options.h"

namespace fsdp::algo {

namespace {

// Options of the other families that mean nothing to a P-EAGLE draft: refused by name when given.
constexpr const char* kNotPEagle[] = {"ttt-length",
                                      "loss-fn",
                                      "lk-loss-type",
                                      "kl-scale",
                                      "kl-decay",
                                      "ttt-step-loss-decay",
                                      "head-chunk-rows",
                                      "accuracy-aggregation",
                                      "noise-std",
                                      "noise-type",
                                      "num-anchors",
                                      "loss-decay-gamma",
                                      "objective-chunk-blocks",
                                      "block-loss-type",
                                      "dpace-alpha",
                                      "draft-block-size",
                                      "dspark-ce-loss-alpha",
                                      "dspark-l1-loss-alpha",
                                      "dspark-confidence-head-alpha"};

model::PEagleConfig load_config(const config::TrainConfig& cfg) {
  model::PEagleConfig c = model::load_peagle_config(cfg.model.draft_model_config);
  if (cfg.dflash.mask_token_id) {
    FSDP_USAGE_CHECK(*cfg.dflash.mask_token_id < c.core.vocab_size,
                     fsdp::str("--mask-token-id ", *cfg.dflash.mask_token_id,
                               " is outside the draft's vocabulary of ", c.core.vocab_size),
                     "give a token id of the target's vocabulary");
    c.mask_token_id = *cfg.dflash.mask_token_id;
  }
  return c;
}

// The stream each sample's depth sampling draws from: keyed by the run's seed, the epoch and the
// sample's dataset index (any rank count draws the same rows), apart from other streams.
at::Generator sample_generator(uint64_t seed, int64_t epoch, int64_t index) {
  constexpr uint64_t kDomain = 0x7065616765636f64ull;  // "peagecod"
  const uint64_t key = mix64(mix64(mix64(seed ^ kDomain) ^ static_cast<uint64_t>(epoch)) ^
                             static_cast<uint64_t>(index));
  return at::make_generator<at::CPUGeneratorImpl>(key);
}

}  // namespace

PEagle::PEagle(const Context& ctx)
    : ctx_(ctx),
      cfg_(*ctx.cfg),
      draft_cfg_(load_config(cfg_)),
      schema_(std::make_unique<PEagleMetrics>(cfg_.peagle.num_depths)) {
  cod_.num_depths = cfg_.peagle.num_depths;
  cod_.down_sample_ratio = cfg_.peagle.down_sample_ratio;
  cod_.down_sample_ratio_min = cfg_.peagle.down_sample_ratio_min;
}

PEagle::~PEagle() = default;

void PEagle::check_supported() const {
  const std::string what = "a P-EAGLE draft (" + cfg_.model.draft_model_config + ")";
  for (const char* name : kNotPEagle) {
    const auto it = cfg_.given_options.find(name);
    FSDP_USAGE_CHECK(
        it == cfg_.given_options.end(),
        fsdp::str("--", name, " (from ", it == cfg_.given_options.end() ? "" : it->second,
                  ") is another draft family's option; ", what, " has no use for it"),
        "drop it (P-EAGLE's own knobs: --num-depths, --down-sample-ratio, "
        "--down-sample-ratio-min, --mask-token-id)");
  }
  FSDP_USAGE_CHECK(cfg_.loop.sp_ulysses_size <= 1,
                   "--sp-ulysses-size with " + what + ": sequence parallelism is EAGLE3's only",
                   "drop --sp-ulysses-size");
  FSDP_USAGE_CHECK(!cfg_.loop.packing,
                   "--packing with " + what +
                       ": SpecForge numbers a packed document's positions from the pack's start, "
                       "which no engine serves",
                   "drop --packing (micro-batches are right-padded)");
  FSDP_USAGE_CHECK(cfg_.model.lora_rank == 0,
                   "--lora-rank with " + what + ": LoRA is EAGLE3's only",
                   "drop --lora-rank to train the whole draft");
  FSDP_USAGE_CHECK(draft_cfg_.mask_token_id.has_value(),
                   what + " has no mask token (the token depths >= 1 embed)",
                   "write \"mask_token_id\": N in the draft config, or give --mask-token-id N");
  FSDP_USAGE_CHECK(cod_.down_sample_ratio_min <= cod_.down_sample_ratio,
                   fsdp::str("--down-sample-ratio-min ", cod_.down_sample_ratio_min,
                             " is above --down-sample-ratio ", cod_.down_sample_ratio),
                   "give a floor at most the ratio (SpecForge's rule)");
  FSDP_USAGE_CHECK(
      !cfg_.given_options.count("export-for") ||
          cfg_.checkpoint.export_for == model::ExportTarget::kVllm,
      fsdp::str("--export-for ", model::export_target_name(cfg_.checkpoint.export_for), ": ", what,
                " is served by vLLM's parallel drafting only (SGLang has none), and "
                "its export is written for vLLM"),
      "drop --export-for (P-EAGLE exports for vLLM) or give --export-for vllm");
}

void PEagle::plan_serving() {
  // vLLM is the only engine with parallel drafting.
  serving_ = plan_eagle_serving(cfg_, draft_cfg_.core, model::ExportTarget::kVllm, ctx_.is_root);
}

void PEagle::check_memory(const model::MemoryPlan&, uint64_t, const std::string&) const {
  // The EAGLE3 estimate counts T unroll steps of the loss rows; P-EAGLE's depths over every
  // anchor are another shape: none is made (docs/model.md "P-EAGLE").
}

data::DatasetOptions PEagle::dataset_options() const {
  return eagle_dataset_options(draft_cfg_.core);
}

void PEagle::check_dataset(const data::FeatureDataset& ds, const std::string& flag) const {
  check_captured_layers(ds, flag, serving_.aux_layers);
}

void PEagle::check_same_architecture(const std::string& saved_config,
                                     const std::string& flag) const {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(saved_config, ec)) return;
  // The export's config.json is the EAGLE3 layout vLLM reads, with mask_token_id.
  const model::DraftConfig saved = model::load_draft_config(saved_config);
  const model::DraftConfig& now = draft_cfg_.core;
  std::string diff;
  const auto cmp = [&](const char* key, int64_t a, int64_t b) {
    if (a != b) diff += fsdp::str(diff.empty() ? "" : ", ", key, " ", a, " vs ", b);
  };
  cmp("hidden_size", saved.hidden_size, now.hidden_size);
  cmp("intermediate_size", saved.intermediate_size, now.intermediate_size);
  cmp("num_attention_heads", saved.num_attention_heads, now.num_attention_heads);
  cmp("num_key_value_heads", saved.num_key_value_heads, now.num_key_value_heads);
  cmp("head_dim", saved.head_dim_value(), now.head_dim_value());
  cmp("num_hidden_layers", saved.num_hidden_layers, now.num_hidden_layers);
  cmp("vocab_size", saved.vocab_size, now.vocab_size);
  cmp("draft_vocab_size", saved.draft_vocab(), now.draft_vocab());
  cmp("target hidden size", saved.target_hidden(), now.target_hidden());
  cmp("captured target layers", saved.num_aux_hidden_states, now.num_aux_hidden_states);
  FSDP_USAGE_CHECK(diff.empty(),
                   flag + ": the checkpoint's draft (" + saved_config +
                       ") and --draft-model-config " + cfg_.model.draft_model_config +
                       " differ in " + diff,
                   "use the draft config the checkpoint was trained with");
}

void PEagle::build(const WeightSources& weights, const data::FeatureDataset* train_ds) {
  const c10::Device& device = ctx_.device;
  const model::DraftConfig& core = draft_cfg_.core;
  mapping_ = choose_vocab_mapping(cfg_, core.vocab_size, core.draft_vocab(), weights, train_ds,
                                  ctx_.control);
  const TargetTensors target = read_target_tensors(
      cfg_, TargetShape{core.vocab_size, core.target_hidden(), core.hidden_size});
  head_ = model::TargetHead(target.lm_head.to(c10::kBFloat16), mapping_.t2d);
  head_.to(device);
  torch::manual_seed(static_cast<uint64_t>(cfg_.loop.seed));
  draft_ = model::PEagleDraft(draft_cfg_);
  if (cfg_.model.draft_init == config::DraftInit::kNormal)
    draft_->normal_init(core.initializer_range);
  draft_->load_embedding(target.embedding);  // SpecForge's warm start; trained from there
  draft_->set_vocab_mapping(mapping_.d2t, mapping_.t2d);
  draft_->set_checkpoint_layer(cfg_.model.activation_checkpointing);
  draft_->to(device);
  shard::EngineOptions eo = train::engine_options(cfg_, device);
  eo.units = draft_->unit_names();
  eo.validate();
  auto groups = shard::make_comm_groups(eo.strategy, device);
  engine_ = std::make_unique<shard::ShardEngine>(*draft_, groups, eo);
  draft_->set_unit_hooks(engine_.get());
  if (weights.init) load_init_weights(*weights.init);
}

void PEagle::load_init_weights(const checkpoint::DraftExport& init) {
  std::map<std::string, at::Tensor> stored(init.weights.begin(), init.weights.end());
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : draft_->named_parameters()) {
    const std::string& name = item.key();
    const std::string exported = model::PEagleDraftImpl::export_name(name);
    auto it = stored.find(exported);
    if (it == stored.end()) it = stored.find(name);
    if (it == stored.end() && name == "embed_tokens.weight") continue;  // keeps the target's
    FSDP_USAGE_CHECK(
        it != stored.end(),
        fsdp::str("--init-checkpoint ", cfg_.model.init_checkpoint, " lacks tensor '", exported,
                  "'"),
        "use an export of a P-EAGLE draft of this config (fsdp-train's or SpecForge's)");
    FSDP_USAGE_CHECK(
        it->second.numel() == item.value().numel(),
        fsdp::str("--init-checkpoint ", cfg_.model.init_checkpoint, ": tensor '", exported,
                  "' has shape ", it->second.sizes(), ", the draft's is ", item.value().sizes()),
        "use the draft config the checkpoint was trained with");
    FSDP_USAGE_CHECK(all_finite(it->second),
                     fsdp::str("--init-checkpoint ", cfg_.model.init_checkpoint, ": tensor '",
                               exported, "' contains NaN or Inf values"),
                     "start from an earlier checkpoint of that run");
    weights[name] = it->second.reshape(item.value().sizes());
  }
  engine_->load_full_state(weights, /*allow_missing=*/true);
}

std::string PEagle::describe_parameters() const {
  int64_t trained = 0;
  for (const auto& p : draft_->trainable_parameters()) trained += p.numel();
  return fsdp::str(trained, " trainable parameters (the embedding and mask_hidden included), ",
                   cod_.num_depths, " depths per step, mask token ", *draft_cfg_.mask_token_id);
}

MicroBatchResult PEagle::forward(const data::Batch& b, bool training) {
  const c10::Device& device = ctx_.device;
  const int64_t B = b.input_ids.size(0), S = b.input_ids.size(1);
  model::PEagleInputs in;
  in.input_ids = b.input_ids.to(device, true);
  in.attention_mask = b.attention_mask.to(device, true);
  in.loss_mask = b.loss_mask.to(device, true);
  in.aux_hidden = b.aux_hidden.to(device, true);
  in.target_hidden = b.target_hidden.to(device, true);
  in.host_loss_mask = b.loss_mask.to(at::kCPU, at::kLong).contiguous();
  // Training samples the rows of each sample (SpecForge's COD); evaluation takes every row, so
  // the engine's walk sees every depth at every anchor.
  std::vector<model::CodRows> rows;
  const at::Tensor valid = b.attention_mask.to(at::kCPU, at::kLong).sum(1).contiguous();
  for (int64_t i = 0; i < B; ++i) {
    if (!training) {
      rows.push_back(model::dense_rows(S, cod_.num_depths));
      continue;
    }
    const int64_t index =
        i < static_cast<int64_t>(b.sample_indices.size()) ? b.sample_indices[i] : -1 - i;
    const int64_t* m = in.host_loss_mask.data_ptr<int64_t>() + i * S;
    rows.push_back(
        model::cod_sample(std::vector<int64_t>(m, m + S), valid.data_ptr<int64_t>()[i], cod_,
                          sample_generator(static_cast<uint64_t>(cfg_.loop.seed), b.epoch, index)));
  }
  model::PEagleStepOptions o;
  o.mask_token_id = *draft_cfg_.mask_token_id;
  o.divisor = training ? static_cast<double>(ctx_.accumulation) : 1.0;
  o.all_rows = !training;
  const model::PEagleStepOutput out =
      model::peagle_step(*draft_, head_, in, rows, cod_.num_depths, o);
  model::PEagleWalk walk;
  if (!training) walk = model::peagle_engine_walk(in.host_loss_mask, out.hits);
  MicroBatchResult r;
  r.loss = out.loss;
  r.sums = static_cast<const PEagleMetrics&>(*schema_).row(out, b.attention_mask.sum(), walk);
  if (training) {
    // Every depth runs the decoder over every anchor; the vocabulary sees the weighted rows.
    std::vector<int64_t> lengths(valid.data_ptr<int64_t>(), valid.data_ptr<int64_t>() + B);
    std::vector<int64_t> head_rows(static_cast<size_t>(cod_.num_depths), 0);
    for (const auto& rr : rows)
      for (int64_t d = 0; d < rr.depths(); ++d)
        head_rows[static_cast<size_t>(d)] += static_cast<int64_t>(rr.anchors[d].size());
    r.flops = model::count_step_flops(draft_cfg_.core, lengths, cod_.num_depths, head_rows).total();
  }
  return r;
}

checkpoint::CheckpointExport PEagle::checkpoint_export() const {
  checkpoint::CheckpointExport e;
  nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(serving_.config_json(draft_cfg_.core.to_json()));
  j["mask_token_id"] = *draft_cfg_.mask_token_id;
  e.config_json = j.dump(2);
  e.d2t = mapping_.d2t;
  e.t2d = mapping_.t2d;
  e.dtype = train::to_dtype(cfg_.checkpoint.export_dtype);
  e.rename = [](const std::string& name) { return model::PEagleDraftImpl::export_name(name); };
  e.trained_embedding = true;
  if (serving_.aux_layers) e.aux_layers_record = model::aux_layers_record(*serving_.aux_layers);
  return e;
}

}  // namespace fsdp::algo
