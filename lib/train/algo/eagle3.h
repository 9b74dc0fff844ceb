// EAGLE3 (and EAGLE3.1, multi-layer, LoRA) behind the algorithm seam (train/algo/algorithm.h):
// the draft config of docs/reference.md §1.1, the shifted feature layout, the TTT unroll and its
// loss family (model/ttt_loss.h), the TTT metrics (eagle3_metrics.h) and the export vLLM and
// SGLang read (checkpoint/serving_contract.h).
#pragma once

#include <memory>
#include <string>

#include "checkpoint/serving_contract.h"
#include "data/vocab_mapping.h"
#include "model/draft_config.h"
#include "model/draft_model.h"
#include "model/target_head.h"
#include "model/ttt_loss.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

class Eagle3 final : public Algorithm {
 public:
  // Reads --draft-model-config (errors name the file and the key).
  explicit Eagle3(const Context& ctx);
  ~Eagle3() override;

  std::string name() const override { return "eagle3"; }
  void check_supported() const override;
  void plan_serving() override;
  void check_memory(const model::MemoryPlan& plan, uint64_t available,
                    const std::string& where) const override;
  data::DatasetOptions dataset_options() const override;
  void check_dataset(const data::FeatureDataset& ds, const std::string& flag) const override;
  void check_same_architecture(const std::string& saved_config,
                               const std::string& flag) const override;
  void build(const WeightSources& weights, const data::FeatureDataset* train_ds) override;
  shard::ShardEngine& engine() override { return *engine_; }
  std::string describe_parameters() const override;
  MicroBatchResult forward(const data::Batch& batch, bool training) override;
  const MetricSchema& metrics() const override { return *schema_; }
  checkpoint::CheckpointExport checkpoint_export() const override;
  bool exports_frozen_base() const override { return draft_->lora_enabled(); }
  void check_resume_fallback(const std::string& loaded, const std::string& newest) const override;

  const model::DraftConfig& draft_config() const { return draft_cfg_; }

 private:
  void enable_lora(const WeightSources& weights);
  void load_init_weights(const checkpoint::DraftExport& init);

  Context ctx_;
  const config::TrainConfig& cfg_;
  model::DraftConfig draft_cfg_;
  checkpoint::ServingPlan serving_;
  data::VocabMapping mapping_;
  model::TargetHead head_;
  model::Eagle3Draft draft_{nullptr};
  std::unique_ptr<shard::ShardEngine> engine_;
  model::LossOptions train_loss_, eval_loss_;
  std::unique_ptr<MetricSchema> schema_;
};

}  // namespace fsdp::algo
