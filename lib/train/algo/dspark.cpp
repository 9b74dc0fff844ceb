// DSpark behind the algorithm seam (train/algo/dspark.h).
#include "train/algo/dspark.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <map>
#include <vector>

#include "core/error.h"
#include "model/block_acceptance.h"
#include "model/block_targets.h"
#include "model/dspark_step.h"
#include "model/memory_estimate.h"
#include "shard/engine.h"
#include "train/algo/block_draft.h"
#include "train/algo/dspark_metrics.h"

namespace fsdp::algo {

namespace {

// The heads' keys of a saved draft config that differ from `now` ("markov_rank 8 vs 4, ...").
std::string heads_difference(const model::DSparkHeadsConfig& saved,
                             const model::DSparkHeadsConfig& now) {
  std::string diff;
  const auto cmp = [&diff](const char* key, const auto& a, const auto& b) {
    if (a != b) diff += fsdp::str(diff.empty() ? "" : ", ", key, " ", a, " vs ", b);
  };
  cmp("markov_rank", saved.markov_rank, now.markov_rank);
  if (saved.has_markov_head() && now.has_markov_head()) {
    cmp("markov_head_type", model::markov_head_type_name(saved.markov_head_type),
        model::markov_head_type_name(now.markov_head_type));
  }
  cmp("enable_confidence_head", saved.enable_confidence_head, now.enable_confidence_head);
  cmp("confidence_head_with_markov", saved.confidence_head_with_markov,
      now.confidence_head_with_markov);
  return diff;
}

}  // namespace

DSpark::DSpark(const Context& ctx)
    : ctx_(ctx),
      cfg_(*ctx.cfg),
      backbone_cfg_(block::load_config(cfg_)),
      heads_cfg_(
          model::parse_dspark_heads_config(backbone_cfg_.json_text, cfg_.model.draft_model_config)),
      alphas_{cfg_.dflash.dspark_ce_loss_alpha, cfg_.dflash.dspark_l1_loss_alpha,
              cfg_.dflash.dspark_confidence_head_alpha},
      schema_(std::make_unique<DSparkMetrics>()) {
  alphas_.validate();
}

DSpark::~DSpark() = default;

bool DSpark::needs_target() const {
  return alphas_.l1 > 0 || (heads_cfg_.enable_confidence_head && alphas_.confidence > 0);
}

void DSpark::check_supported() const {
  block::check_supported(cfg_, backbone_cfg_, "a DSpark", "a DFlash",
                         {"block-loss-type", "dpace-alpha"});
}

void DSpark::plan_serving() {
  export_config_ = block::export_config(cfg_, backbone_cfg_);
}

void DSpark::check_memory(const model::MemoryPlan&, uint64_t, const std::string&) const {
  // The EAGLE3 estimate does not describe a block draft; none is made (docs/model.md).
}

data::DatasetOptions DSpark::dataset_options() const {
  return block::dataset_options(backbone_cfg_, needs_target());
}

void DSpark::check_dataset(const data::FeatureDataset& ds, const std::string& flag) const {
  block::check_dataset(ds, flag, "a DSpark draft",
                       "input_ids, loss_mask, hidden_states, target_last_hidden_states");
}

void DSpark::check_same_architecture(const std::string& saved_config,
                                     const std::string& flag) const {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(saved_config, ec)) return;
  std::string diff =
      block::backbone_difference(model::load_dflash_config(saved_config), backbone_cfg_);
  const std::string heads =
      heads_difference(model::load_dspark_heads_config(saved_config), heads_cfg_);
  if (!heads.empty()) diff += (diff.empty() ? "" : ", ") + heads;
  FSDP_USAGE_CHECK(diff.empty(),
                   flag + ": the checkpoint's draft (" + saved_config +
                       ") and --draft-model-config " + cfg_.model.draft_model_config +
                       " differ in " + diff,
                   "use the draft config the checkpoint was trained with");
}

void DSpark::build(const WeightSources& weights, const data::FeatureDataset*) {
  mask_token_ = backbone_cfg_.require_mask_token();
  const block::FrozenTarget target = block::frozen_target(cfg_, backbone_cfg_, ctx_.device);
  embedding_ = target.embedding;
  lm_head_ = target.lm_head;
  torch::manual_seed(static_cast<uint64_t>(cfg_.loop.seed));
  draft_ = model::DSparkDraft(backbone_cfg_, heads_cfg_);
  if (cfg_.model.draft_init == config::DraftInit::kNormal)
    draft_->normal_init(backbone_cfg_.core.initializer_range);
  draft_->to(ctx_.device);
  engine_ = block::make_engine(cfg_, *draft_, draft_->unit_names(), ctx_.device);
  draft_->set_unit_hooks(engine_.get());
  if (!weights.init) return;
  // SpecForge's early DSpark exports kept the heads under logit_head.
  checkpoint::DraftExport init = *weights.init;
  init.weights.clear();
  for (const auto& [name, t] : weights.init->weights)
    init.weights[model::dspark_state_dict_name(name)] = t;
  block::load_init_weights(*draft_, *engine_, init, cfg_.model.init_checkpoint, "DSpark");
}

std::string DSpark::describe_parameters() const {
  int64_t trained = 0, heads = 0;
  for (const auto& p : draft_->parameters()) trained += p.numel();
  for (const auto& p : draft_->heads->parameters()) heads += p.numel();
  return fsdp::str(trained, " trainable parameters (heads ", heads,
                   "; + the target's embedding and LM head, frozen: ", 2 * embedding_.numel(),
                   "), blocks of ", backbone_cfg_.block_size, ", ",
                   backbone_cfg_.target_layer_ids.size(), " target layers, Markov rank ",
                   heads_cfg_.markov_rank,
                   heads_cfg_.enable_confidence_head ? ", confidence head" : "");
}

MicroBatchResult DSpark::forward(const data::Batch& b, bool training) {
  const c10::Device& device = ctx_.device;
  const int64_t B = b.input_ids.size(0), bs = backbone_cfg_.block_size;
  const block::BlockInputs blocks =
      block::block_inputs(cfg_, b, bs, embedding_, mask_token_, device);
  model::DSparkStepInputs in;
  in.embedded = blocks.embedded;
  in.context = b.aux_hidden.to(device, true);
  in.layout = &blocks.layout;
  in.input_ids = blocks.ids;
  in.loss_mask = blocks.loss_mask;
  if (needs_target()) in.target_hidden = b.target_hidden.to(device, lm_head_.scalar_type(), true);
  in.lm_head = lm_head_;
  in.decay_gamma = cfg_.dflash.loss_decay_gamma;
  in.alphas = alphas_;
  in.chunk_blocks = cfg_.dflash.objective_chunk_blocks;
  // Evaluation also walks the replies as the engine drafts them (model/block_acceptance.h): the
  // anchor sampler's candidates (p and p + 1 supervised) are every anchor the walk can reach.
  std::vector<at::Tensor> accepted;
  if (!training) in.accepted_blocks = &accepted;
  const model::DSparkStep step = model::dspark_step(*draft_, in);
  model::EngineWalk walk;
  if (!training) walk = model::engine_walk(b.loss_mask, blocks.layout, at::cat(accepted, 1));

  // SpecForge's normaliser: the loss weights' sum over every rank's blocks. Training divides the
  // gradients by the step's sum of it over every micro-batch and rank (train::StepRunner).
  const at::Tensor den = step.loss_weights.sum().to(step.loss_sum.scalar_type());
  return block::micro_batch_result(
      step.loss_sum, den,
      DSparkMetrics::row(step.loss_sum, den, b.attention_mask.sum(), step.terms, walk).to(device),
      training, backbone_cfg_, B, b.input_ids.size(1), blocks.layout.num_blocks());
}

checkpoint::CheckpointExport DSpark::checkpoint_export() const {
  return block::checkpoint_export(cfg_, export_config_);
}

}  // namespace fsdp::algo
