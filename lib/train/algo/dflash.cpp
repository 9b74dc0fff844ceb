// DFlash behind the algorithm seam (train/algo/dflash.h).
#include "train/algo/dflash.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <filesystem>

#include "checkpoint/export.h"
#include "core/error.h"
#include "model/block_acceptance.h"
#include "model/block_targets.h"
#include "model/memory_estimate.h"
#include "shard/engine.h"
#include "train/algo/block_draft.h"
#include "train/algo/block_metrics.h"

namespace fsdp::algo {

namespace {

model::BlockLoss to_block_loss(config::BlockLossType t) {
  switch (t) {
    case config::BlockLossType::kDFlash:
      return model::BlockLoss::kDFlash;
    case config::BlockLossType::kDPace:
      return model::BlockLoss::kDPace;
    case config::BlockLossType::kDPaceCumulativeConfidenceOnly:
      return model::BlockLoss::kDPaceCumulativeConfidence;
    case config::BlockLossType::kDPaceContinuationValueOnly:
      return model::BlockLoss::kDPaceContinuationValue;
  }
  return model::BlockLoss::kDFlash;
}

}  // namespace

DFlash::DFlash(const Context& ctx)
    : ctx_(ctx),
      cfg_(*ctx.cfg),
      draft_cfg_(block::load_config(cfg_)),
      schema_(std::make_unique<BlockMetrics>()) {
  objective_.loss = to_block_loss(cfg_.dflash.loss_type);
  objective_.dpace_alpha = cfg_.dflash.dpace_alpha;
  objective_.decay_gamma = cfg_.dflash.loss_decay_gamma;
  objective_.chunk_blocks = cfg_.dflash.objective_chunk_blocks;
}

DFlash::~DFlash() = default;

void DFlash::check_supported() const {
  block::check_supported(
      cfg_, draft_cfg_, "a DFlash", "a DSpark",
      {"dspark-ce-loss-alpha", "dspark-l1-loss-alpha", "dspark-confidence-head-alpha"});
}

void DFlash::plan_serving() {
  export_config_ = block::export_config(cfg_, draft_cfg_);
}

void DFlash::check_memory(const model::MemoryPlan&, uint64_t, const std::string&) const {
  // The EAGLE3 estimate does not describe a block draft; none is made (docs/model.md).
}

data::DatasetOptions DFlash::dataset_options() const {
  return block::dataset_options(draft_cfg_, /*needs_last_hidden=*/false);
}

void DFlash::check_dataset(const data::FeatureDataset& ds, const std::string& flag) const {
  block::check_dataset(ds, flag, "a DFlash draft", "input_ids, loss_mask, hidden_states");
}

void DFlash::check_same_architecture(const std::string& saved_config,
                                     const std::string& flag) const {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(saved_config, ec)) return;
  const std::string diff =
      block::backbone_difference(model::load_dflash_config(saved_config), draft_cfg_);
  FSDP_USAGE_CHECK(diff.empty(),
                   flag + ": the checkpoint's draft (" + saved_config +
                       ") and --draft-model-config " + cfg_.model.draft_model_config +
                       " differ in " + diff,
                   "use the draft config the checkpoint was trained with");
}

void DFlash::build(const WeightSources& weights, const data::FeatureDataset*) {
  mask_token_ = draft_cfg_.require_mask_token();
  const block::FrozenTarget target = block::frozen_target(cfg_, draft_cfg_, ctx_.device);
  embedding_ = target.embedding;
  lm_head_ = target.lm_head;
  torch::manual_seed(static_cast<uint64_t>(cfg_.loop.seed));
  draft_ = model::DFlashDraft(draft_cfg_);
  if (cfg_.model.draft_init == config::DraftInit::kNormal)
    draft_->normal_init(draft_cfg_.core.initializer_range);
  draft_->to(ctx_.device);
  engine_ = block::make_engine(cfg_, *draft_, draft_->unit_names(), ctx_.device);
  draft_->set_unit_hooks(engine_.get());
  if (weights.init) {
    block::load_init_weights(*draft_, *engine_, *weights.init, cfg_.model.init_checkpoint,
                             "DFlash");
  }
}

std::string DFlash::describe_parameters() const {
  int64_t trained = 0;
  for (const auto& p : draft_->parameters()) trained += p.numel();
  return fsdp::str(trained, " trainable parameters (+ the target's embedding and LM head, frozen: ",
                   2 * embedding_.numel(), "), blocks of ", draft_cfg_.block_size, ", ",
                   draft_cfg_.target_layer_ids.size(), " target layers");
}

MicroBatchResult DFlash::forward(const data::Batch& b, bool training) {
  const c10::Device& device = ctx_.device;
  const int64_t B = b.input_ids.size(0);
  const block::BlockInputs in =
      block::block_inputs(cfg_, b, draft_cfg_.block_size, embedding_, mask_token_, device);
  const at::Tensor out = draft_->forward(in.embedded, b.aux_hidden.to(device, true), in.layout);
  const model::BlockLabels labels = model::dflash_labels(in.ids, in.loss_mask, in.layout);
  const int64_t N = in.layout.num_blocks();
  // Evaluation also walks the replies as the engine drafts them (model/block_acceptance.h).
  std::vector<at::Tensor> accepted;
  model::DFlashObjectiveOptions options = objective_;
  if (!training) options.accepted_blocks = &accepted;
  const model::DFlashTerms t = model::dflash_objective(out.view({B, N, draft_cfg_.block_size, -1}),
                                                       labels, lm_head_, options);
  model::EngineWalk walk;
  if (!training) walk = model::engine_walk(b.loss_mask, in.layout, at::cat(accepted, 1));
  // The normaliser, as SpecForge's: dflash the (decayed) weights, D-PACE the rows (its batch
  // size). Training divides the gradients by the step's sum of it over every micro-batch and
  // rank (train::StepRunner), the metrics their sums likewise.
  const at::Tensor den = objective_.loss == model::BlockLoss::kDFlash
                             ? t.loss_den.detach()
                             : at::full({}, static_cast<double>(B), t.loss_num.options());
  return block::micro_batch_result(
      t.loss_num, den,
      BlockMetrics::row(t.loss_num, den, b.attention_mask.sum(), t, walk).to(device), training,
      draft_cfg_, B, b.input_ids.size(1), N);
}

checkpoint::CheckpointExport DFlash::checkpoint_export() const {
  return block::checkpoint_export(cfg_, export_config_);
}

}  // namespace fsdp::algo
