// What the drafts read from EAGLE3 features share (EAGLE3 and P-EAGLE): the vocabulary mapping
// their LM head over a draft vocabulary trains with, and the check that a dump holds the target
// layers the draft reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/serving_contract.h"
#include "config/train_config.h"
#include "data/dataset.h"
#include "data/vocab_mapping.h"
#include "model/aux_layers.h"
#include "model/draft_config.h"
#include "train/algo/algorithm.h"

namespace fsdp::algo {

// The mapping: the resumed checkpoint's, else the --init-checkpoint's, else one from
// --vocab-mapping-path, the cache, or the features. V, Vd: the draft config's vocabulary and draft
// vocabulary. UsageError naming the source when its sizes disagree with them, or when there is
// nothing to build one from. Collective when built from the features (`control`, every rank).
data::VocabMapping choose_vocab_mapping(const config::TrainConfig& cfg, int64_t V, int64_t Vd,
                                        const WeightSources& weights,
                                        const data::FeatureDataset* train_ds,
                                        comm::Communicator* control);

// What the loader must check of a sample for a draft of this config: its vocabulary, captured
// layers and the target's hidden size.
data::DatasetOptions eagle_dataset_options(const model::DraftConfig& draft);

// The serving plan of the export (checkpoint/serving_contract.h) for engine `export_for`, its
// notes logged on the root rank.
checkpoint::ServingPlan plan_eagle_serving(const config::TrainConfig& cfg,
                                           const model::DraftConfig& draft,
                                           model::ExportTarget export_for, bool is_root);

// A dump that records its layers (DeepSpec's manifest) must hold the layers the draft reads
// (`aux_layers`, the serving plan's; nothing is checked without either): UsageError naming
// `flag`, the dump and both lists.
void check_captured_layers(const data::FeatureDataset& ds, const std::string& flag,
                           const std::optional<model::AuxLayers>& aux_layers);

}  // namespace fsdp::algo
