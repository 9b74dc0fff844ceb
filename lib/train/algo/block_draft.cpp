// What the block-draft families share (train/algo/block_draft.h).
#include "train/algo/block_draft.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/block_draft_contract.h"
#include "checkpoint/export_check.h"
#include "core/error.h"
#include "core/finite.h"
#include "model/block_targets.h"
#include "shard/engine.h"
#include "train/algo/target_tensors.h"
#include "train/component_options.h"

namespace fsdp::algo::block {

namespace {

// Options EAGLE3 reads that mean nothing to a block draft: refused by name when given.
constexpr const char* kEagle3Only[] = {"ttt-length",
                                       "loss-fn",
                                       "lk-loss-type",
                                       "kl-scale",
                                       "kl-decay",
                                       "ttt-step-loss-decay",
                                       "vocab-mapping-path",
                                       "head-chunk-rows",
                                       "aux-layer-convention",
                                       "accuracy-aggregation",
                                       "noise-std",
                                       "noise-type"};

}  // namespace

model::DFlashConfig load_config(const config::TrainConfig& cfg) {
  model::DFlashConfig c = model::load_dflash_config(cfg.model.draft_model_config);
  if (!cfg.dflash.block_size && !cfg.dflash.mask_token_id) return c;
  nlohmann::json j = nlohmann::json::parse(c.json_text);
  if (cfg.dflash.block_size) j["block_size"] = *cfg.dflash.block_size;
  if (cfg.dflash.mask_token_id) {
    if (!j.contains("dflash_config") || !j["dflash_config"].is_object())
      j["dflash_config"] = nlohmann::json::object();
    j["dflash_config"]["mask_token_id"] = *cfg.dflash.mask_token_id;
  }
  return model::parse_dflash_config(j.dump(2), cfg.model.draft_model_config);
}

void check_supported(const config::TrainConfig& cfg, const model::DFlashConfig& draft,
                     const std::string& family, const std::string& other_family,
                     const std::vector<std::string>& other_options) {
  const std::string what = family + " draft (" + cfg.model.draft_model_config + ")";
  const auto refuse = [&](const std::string& name, const std::string& whose) {
    const auto it = cfg.given_options.find(name);
    FSDP_USAGE_CHECK(
        it == cfg.given_options.end(),
        fsdp::str("--", name, " (from ", it == cfg.given_options.end() ? "" : it->second, ") is ",
                  whose, " option; ", what, " has no use for it"),
        fsdp::str("drop it, or train ", whose, " draft config"));
  };
  for (const char* name : kEagle3Only) refuse(name, "an EAGLE3");
  for (const auto& name : other_options) refuse(name, other_family);
  FSDP_USAGE_CHECK(cfg.loop.sp_ulysses_size <= 1,
                   "--sp-ulysses-size with " + what + ": sequence parallelism is EAGLE3's only",
                   "drop --sp-ulysses-size (a block draft's context is read whole by every block)");
  FSDP_USAGE_CHECK(!cfg.loop.packing,
                   "--packing with " + what + ": blocks would attend across documents",
                   "drop --packing (micro-batches are right-padded)");
  FSDP_USAGE_CHECK(cfg.model.lora_rank == 0, "--lora-rank with " + what + ": LoRA is EAGLE3's only",
                   "drop --lora-rank to train the whole draft");
  draft.require_mask_token();
}

std::string export_config(const config::TrainConfig& cfg, const model::DFlashConfig& draft) {
  checkpoint::BlockDraftTraining t;
  t.source = cfg.model.draft_model_config;
  t.target_layer_ids = draft.target_layer_ids;
  t.mask_token_id = draft.require_mask_token();
  const checkpoint::TargetFacts target = checkpoint::read_target_facts(cfg.model.target_model_path);
  t.target_num_layers = target.num_layers;
  t.target_vocab_size = target.vocab_size;
  t.target_hidden_size = target.hidden_size;
  t.torch_dtype = cfg.checkpoint.export_dtype == config::Precision::kFP32 ? "float32" : "bfloat16";
  nlohmann::json j = nlohmann::json::parse(draft.json_text);
  j["block_size"] = draft.block_size;
  return checkpoint::block_draft_export_config(j, t).dump(2);
}

checkpoint::CheckpointExport checkpoint_export(const config::TrainConfig& cfg,
                                               const std::string& config_json) {
  checkpoint::CheckpointExport e;
  e.config_json = config_json;
  e.block_draft = true;
  e.dtype = train::to_dtype(cfg.checkpoint.export_dtype);
  return e;
}

data::DatasetOptions dataset_options(const model::DFlashConfig& draft, bool needs_last_hidden) {
  data::DatasetOptions dso;
  dso.vocab_size = draft.core.vocab_size;
  dso.hidden_size = draft.hidden_size();
  dso.num_aux_layers = static_cast<int64_t>(draft.target_layer_ids.size());
  // SpecForge's .ckpt names; the other formats keep their own (data/dataset.h).
  dso.hidden_key = "target_last_hidden_states";
  dso.aux_key = "hidden_states";
  dso.last_hidden = needs_last_hidden ? data::DatasetOptions::LastHidden::kRequired
                                      : data::DatasetOptions::LastHidden::kUnused;
  // SpecForge's ids are layer outputs, as DeepSpec's manifest records them.
  dso.layer_ids = draft.target_layer_ids;
  dso.layers_key = "dflash_config.target_layer_ids";
  return dso;
}

void check_dataset(const data::FeatureDataset& ds, const std::string& flag,
                   const std::string& family, const std::string& keys) {
  // The formats whose layout carries a block draft's features: the target layers' states
  // concatenated (or stacked, speculators) and the target's last hidden state (docs/data.md).
  static const char* const kCarry[] = {"ckpt", "speculators", "modelopt", "deepspec", "native"};
  const bool carries = std::any_of(std::begin(kCarry), std::end(kCarry),
                                   [&](const char* f) { return ds.format() == f; });
  FSDP_USAGE_CHECK(carries,
                   fsdp::str(flag, ": ", ds.root(), " is in the '", ds.format(), "' format, which ",
                             "does not carry what ", family, " reads (", keys, ")"),
                   "dump the features with a producer whose layout carries them (SpecForge, "
                   "speculators, ModelOpt or DeepSpec: docs/block-drafts.md \"Features\")");
}

std::string backbone_difference(const model::DFlashConfig& saved, const model::DFlashConfig& now) {
  std::string diff;
  const auto cmp = [&diff](const char* key, const auto& a, const auto& b) {
    if (a != b) diff += fsdp::str(diff.empty() ? "" : ", ", key, " ", a, " vs ", b);
  };
  cmp("hidden_size", saved.hidden_size(), now.hidden_size());
  cmp("intermediate_size", saved.core.intermediate_size, now.core.intermediate_size);
  cmp("num_attention_heads", saved.core.num_attention_heads, now.core.num_attention_heads);
  cmp("num_key_value_heads", saved.core.num_key_value_heads, now.core.num_key_value_heads);
  cmp("head_dim", saved.head_dim(), now.head_dim());
  cmp("num_hidden_layers", saved.num_layers(), now.num_layers());
  cmp("target layers", saved.target_layer_ids.size(), now.target_layer_ids.size());
  cmp("attention_bias", saved.attention_bias, now.attention_bias);
  return diff;
}

model::BlockLayout sample_layout(const config::TrainConfig& cfg, const data::Batch& b,
                                 int64_t block_size, const c10::Device& device) {
  const int64_t B = b.input_ids.size(0);
  std::vector<model::AnchorStream> streams;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t index =
        i < static_cast<int64_t>(b.sample_indices.size()) ? b.sample_indices[i] : -1 - i;
    streams.push_back(model::anchor_stream(static_cast<uint64_t>(cfg.loop.seed), b.epoch, index));
  }
  return model::sample_blocks(b.loss_mask, cfg.dflash.num_anchors, block_size, streams, device);
}

double backbone_step_flops(const model::DFlashConfig& c, int64_t B, int64_t S, int64_t N,
                           int64_t V) {
  const double H = static_cast<double>(c.hidden_size()),
               I = static_cast<double>(c.core.intermediate_size);
  const double qd = static_cast<double>(c.core.num_attention_heads * c.head_dim());
  const double kvd = static_cast<double>(c.core.num_key_value_heads * c.head_dim());
  const double Q = static_cast<double>(N * c.block_size), ctx = static_cast<double>(S);
  const double rows = static_cast<double>(B);
  double layer = Q * (2 * H * qd + 2 * 2 * H * kvd + 2 * qd * H + 3 * 2 * H * I) +
                 ctx * 2 * 2 * H * kvd + 2 * 2 * Q * (ctx + static_cast<double>(c.block_size)) * qd;
  const double fwd = rows * (ctx * 2 * static_cast<double>(c.fc_in_features()) * H +
                             static_cast<double>(c.num_layers()) * layer);
  return 3 * fwd + 2 * rows * Q * 2 * H * static_cast<double>(V);
}

FrozenTarget frozen_target(const config::TrainConfig& cfg, const model::DFlashConfig& draft,
                           const c10::Device& device) {
  const TargetTensors target = read_target_tensors(
      cfg, TargetShape{draft.core.vocab_size, draft.hidden_size(), draft.hidden_size()});
  const auto dtype = train::to_dtype(cfg.shard.mixed_precision);
  return {target.embedding.to(device, dtype), target.lm_head.to(device, dtype)};
}

std::unique_ptr<shard::ShardEngine> make_engine(const config::TrainConfig& cfg,
                                                torch::nn::Module& module,
                                                std::vector<std::string> units,
                                                const c10::Device& device) {
  shard::EngineOptions eo = train::engine_options(cfg, device);
  eo.units = std::move(units);
  eo.validate();
  auto groups = shard::make_comm_groups(eo.strategy, device);
  return std::make_unique<shard::ShardEngine>(module, groups, eo);
}

BlockInputs block_inputs(const config::TrainConfig& cfg, const data::Batch& b, int64_t block_size,
                         const at::Tensor& embedding, int64_t mask_token,
                         const c10::Device& device) {
  BlockInputs in;
  in.layout = sample_layout(cfg, b, block_size, device);
  in.ids = b.input_ids.to(device, true);
  in.loss_mask = b.loss_mask.to(device, true);
  in.embedded = at::embedding(embedding, model::block_input_ids(in.ids, in.layout, mask_token));
  return in;
}

MicroBatchResult micro_batch_result(const at::Tensor& loss_sum, const at::Tensor& den,
                                    const at::Tensor& sums, bool training,
                                    const model::DFlashConfig& draft, int64_t B, int64_t S,
                                    int64_t N) {
  MicroBatchResult r;
  r.sums = sums;
  r.loss = loss_sum;
  if (training) {
    r.flops = backbone_step_flops(draft, B, S, N, draft.core.vocab_size);
    r.normaliser = den;
  }
  return r;
}

void load_init_weights(torch::nn::Module& module, shard::ShardEngine& engine,
                       const checkpoint::DraftExport& init, const std::string& init_path,
                       const std::string& family) {
  std::map<std::string, at::Tensor> w(init.weights.begin(), init.weights.end());
  for (const auto& item : module.named_parameters()) {
    FSDP_USAGE_CHECK(w.count(item.key()),
                     fsdp::str("--init-checkpoint ", init_path, " lacks tensor '", item.key(), "'"),
                     fsdp::str("use an export of a ", family,
                               " draft of this config (fsdp-train's or SpecForge's)"));
    FSDP_USAGE_CHECK(all_finite(w.at(item.key())),
                     fsdp::str("--init-checkpoint ", init_path, ": tensor '", item.key(),
                               "' contains NaN or Inf values"),
                     "start from an earlier checkpoint of that run");
  }
  engine.load_full_state(w, /*allow_missing=*/false);
}

}  // namespace fsdp::algo::block
