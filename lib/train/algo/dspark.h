// DSpark behind the algorithm seam (train/algo/algorithm.h; docs/block-drafts.md "DSpark"): the
// DFlash backbone with DSpark's Markov and confidence heads (model/dspark_draft.h), SpecForge's
// offline features (input_ids, loss_mask, hidden_states of the target layers and
// target_last_hidden_states), anchors drawn per sample from the run's seed as DFlash draws them,
// the DSpark objective (model/dspark_objective.h: cross-entropy, the L1 distance to the target's
// distribution, the confidence head's loss) normalised by the step's loss weights over every
// rank, SpecForge's DSpark metrics, and the export the engines read.
#pragma once

#include <memory>
#include <string>

#include "model/dflash_config.h"
#include "model/dspark_draft.h"
#include "model/dspark_heads_config.h"
#include "model/dspark_objective.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

class DSpark final : public Algorithm {
 public:
  // Reads --draft-model-config (the backbone's keys and the heads'; errors name the file and the
  // key) and applies the run's block-draft overrides.
  explicit DSpark(const Context& ctx);
  ~DSpark() override;

  std::string name() const override { return "dspark"; }
  void check_supported() const override;
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

 private:
  // Whether the objective reads target_last_hidden_states (the L1 term, or a confidence head
  // with a weight).
  bool needs_target() const;

  Context ctx_;
  const config::TrainConfig& cfg_;
  model::DFlashConfig backbone_cfg_;
  model::DSparkHeadsConfig heads_cfg_;
  model::DSparkAlphas alphas_;
  int64_t mask_token_ = 0;
  std::string export_config_;
  at::Tensor embedding_, lm_head_;  // the target's, frozen, compute dtype, on the device
  model::DSparkDraft draft_{nullptr};
  std::unique_ptr<shard::ShardEngine> engine_;
  std::unique_ptr<MetricSchema> schema_;
};

}  // namespace fsdp::algo
