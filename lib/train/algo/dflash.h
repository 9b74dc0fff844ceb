// DFlash behind the algorithm seam (train/algo/algorithm.h; docs/block-drafts.md): the
// block-draft config, SpecForge's offline features (input_ids, loss_mask, hidden_states of the
// target layers, unshifted), anchors drawn per sample from the run's seed, the draft's blocks
// through the target's frozen embedding and LM head, the DFlash / D-PACE objective, the block
// metrics, and the export vLLM and SGLang read.
#pragma once

#include <memory>
#include <string>

#include "model/dflash_config.h"
#include "model/dflash_model.h"
#include "model/dflash_objective.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

class DFlash final : public Algorithm {
 public:
  // Reads --draft-model-config (errors name the file and the key) and applies the run's
  // block-draft overrides (--draft-block-size, --mask-token-id).
  explicit DFlash(const Context& ctx);
  ~DFlash() override;

  std::string name() const override { return "dflash"; }
  void check_supported() const override;
  // The export's config.json from the serving contract (checkpoint/block_draft_contract.h), made
  // now so that a draft the engines cannot serve as trained stops before training.
  void plan_serving() override;
  void check_memory(const model::MemoryPlan& plan, uint64_t available,
                    const std::string& where) const override;
  data::DatasetOptions dataset_options() const override;
  data::SampleLayout sample_layout() const override { return data::SampleLayout::kBlock; }
  void check_dataset(const data::FeatureDataset& ds, const std::string& flag) const override;
  void check_same_architecture(const std::string& saved_config,
                               const std::string& flag) const override;
  void build(const WeightSources& weights, const data::FeatureDataset* train_ds) override;
  shard::ShardEngine& engine() override { return *engine_; }
  std::string describe_parameters() const override;
  MicroBatchResult forward(const data::Batch& batch, bool training) override;
  const MetricSchema& metrics() const override { return *schema_; }
  checkpoint::CheckpointExport checkpoint_export() const override;
  bool exports_frozen_base() const override { return false; }
  void check_resume_fallback(const std::string&, const std::string&) const override {}

  const model::DFlashConfig& draft_config() const { return draft_cfg_; }

 private:
  Context ctx_;
  const config::TrainConfig& cfg_;
  model::DFlashConfig draft_cfg_;
  int64_t mask_token_ = 0;
  std::string export_config_;
  model::DFlashObjectiveOptions objective_;
  at::Tensor embedding_, lm_head_;  // the target's, frozen, compute dtype, on the device
  model::DFlashDraft draft_{nullptr};
  std::unique_ptr<shard::ShardEngine> engine_;
  std::unique_ptr<MetricSchema> schema_;
};

}  // namespace fsdp::algo
