// P-EAGLE behind the algorithm seam (train/algo/algorithm.h; docs/model.md "P-EAGLE"): SpecForge
// 0.2.0's PEagleDraftModel config, EAGLE3's features and vocabulary mapping, the parallel
// drafting step over sampled depths (model/peagle_step.h) with its rows drawn per sample from the
// run's seed, SpecForge's P-EAGLE metrics and the engine's acceptance under parallel drafting,
// and the export vLLM's EAGLE3 loader reads with parallel_drafting.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/serving_contract.h"
#include "data/vocab_mapping.h"
#include "model/peagle_config.h"
#include "model/peagle_model.h"
#include "model/peagle_sampling.h"
#include "model/target_head.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

class PEagle final : public Algorithm {
 public:
  // Reads --draft-model-config (a PEagleDraftModel config) with --mask-token-id applied.
  explicit PEagle(const Context& ctx);
  ~PEagle() override;

  std::string name() const override { return "peagle"; }
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
  bool exports_frozen_base() const override { return false; }
  void check_resume_fallback(const std::string&, const std::string&) const override {}

 private:
  void load_init_weights(const checkpoint::DraftExport& init);

  Context ctx_;
  const config::TrainConfig& cfg_;
  model::PEagleConfig draft_cfg_;
  model::CodOptions cod_;
  checkpoint::ServingPlan serving_;
  data::VocabMapping mapping_;
  model::TargetHead head_;
  model::PEagleDraft draft_{nullptr};
  std::unique_ptr<shard::ShardEngine> engine_;
  std::unique_ptr<MetricSchema> schema_;
};

}  // namespace fsdp::algo
