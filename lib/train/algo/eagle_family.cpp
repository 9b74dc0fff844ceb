// What the drafts read from EAGLE3 features share (train/algo/eagle_family.h).
#include "train/algo/eagle_family.h"

#include "checkpoint/export.h"
#include "core/error.h"
#include "core/log.h"

namespace fsdp::algo {

data::VocabMapping choose_vocab_mapping(const config::TrainConfig& cfg, int64_t V, int64_t Vd,
                                        const WeightSources& weights,
                                        const data::FeatureDataset* train_ds,
                                        comm::Communicator* control) {
  const checkpoint::DraftExport* init = weights.init;
  data::VocabMapping mapping;
  // Vocabulary mapping: from the checkpoint a resume loads, else the initial checkpoint (each
  // defines what its lm_head rows mean), else a mapping file, the cache, or the features.
  if (cfg.model.lora_rank > 0) {
    // The adapted draft keeps its base's lm_head rows, which mean the base's d2t/t2d: another
    // mapping would make them mean other tokens.
    FSDP_USAGE_CHECK(cfg.model.vocab_mapping_path.empty(),
                     "--vocab-mapping-path with --lora-rank: LoRA keeps the base draft's lm_head, "
                     "whose rows are the tokens of the base's own d2t/t2d",
                     "drop --vocab-mapping-path (the base's mapping is used), or fine-tune the "
                     "whole draft without --lora-rank");
    FSDP_USAGE_CHECK(!init || (init->d2t.defined() && init->t2d.defined()),
                     "--lora-rank: the --init-checkpoint " + cfg.model.init_checkpoint +
                         " has no d2t/t2d, so its lm_head rows mean unknown tokens",
                     "adapt an export that carries its vocabulary mapping (fsdp-train and "
                     "SpecForge exports do)");
  }
  std::pair<at::Tensor, at::Tensor> resumed_mapping;
  if (!weights.resume_dir.empty())
    resumed_mapping = checkpoint::read_export_mapping(weights.resume_dir);
  if (resumed_mapping.first.defined() && resumed_mapping.second.defined()) {
    FSDP_USAGE_CHECK(resumed_mapping.first.numel() == Vd && resumed_mapping.second.numel() == V,
                     fsdp::str("--resume: d2t/t2d of ", weights.resume_dir, " have ",
                               resumed_mapping.first.numel(), "/", resumed_mapping.second.numel(),
                               " entries, the draft config says Vd=", Vd, " V=", V),
                     "use the draft config the checkpoint was trained with");
    mapping.d2t = resumed_mapping.first;
    mapping.t2d = resumed_mapping.second;
    FSDP_LOG0(kInfo) << "vocab mapping: the one of " << weights.resume_dir << " (resumed)";
  } else if (init && init->d2t.defined() && init->t2d.defined()) {
    FSDP_USAGE_CHECK(
        init->d2t.numel() == Vd && init->t2d.numel() == V,
        fsdp::str("--init-checkpoint: d2t/t2d have ", init->d2t.numel(), "/", init->t2d.numel(),
                  " entries, the draft config says Vd=", Vd, " V=", V),
        "use the draft config the checkpoint was trained with");
    mapping.d2t = init->d2t;
    mapping.t2d = init->t2d;
  } else {
    FSDP_USAGE_CHECK(train_ds != nullptr || !cfg.model.vocab_mapping_path.empty(),
                     "no data to build the vocabulary mapping from",
                     "give --train-hidden-states-path, --eval-hidden-states-path or "
                     "--vocab-mapping-path");
    data::VocabMappingOptions vmo;
    vmo.mapping_path = cfg.model.vocab_mapping_path;
    vmo.cache_dir = cfg.data.cache_dir;
    vmo.vocab_size = V;
    vmo.draft_vocab_size = Vd;
    vmo.max_length = cfg.data.max_length;
    vmo.skip_bad_samples = cfg.data.skip_bad_samples;
    mapping = data::build_vocab_mapping(*train_ds, vmo, control);
  }
  return mapping;
}

data::DatasetOptions eagle_dataset_options(const model::DraftConfig& draft) {
  data::DatasetOptions dso;
  dso.vocab_size = draft.vocab_size;
  dso.num_aux_layers = draft.num_aux_hidden_states;
  dso.hidden_size = draft.target_hidden();
  return dso;
}

checkpoint::ServingPlan plan_eagle_serving(const config::TrainConfig& cfg,
                                           const model::DraftConfig& draft,
                                           model::ExportTarget export_for, bool is_root) {
  checkpoint::ServingRequest request;
  request.draft_config_path = cfg.model.draft_model_config;
  request.draft_config_json = draft.to_json();
  request.num_aux_hidden_states = draft.num_aux_hidden_states;
  request.convention = cfg.model.aux_layer_convention;
  request.target_model_path = cfg.model.target_model_path;
  request.export_for = export_for;
  request.rope_scaling = cfg.checkpoint.export_rope_scaling;
  request.max_length = cfg.data.max_length;
  checkpoint::ServingPlan plan = checkpoint::plan_serving_export(request);
  if (!is_root) return plan;
  for (const auto& note : plan.notes) {
    if (note.warn)
      FSDP_LOG0(kWarn) << note.text;
    else
      FSDP_LOG0(kInfo) << note.text;
  }
  return plan;
}

void check_captured_layers(const data::FeatureDataset& ds, const std::string& flag,
                           const std::optional<model::AuxLayers>& aux_layers) {
  if (ds.captured_layer_ids().empty() || !aux_layers) return;
  std::vector<int64_t> hs;  // 0-based layer output id i is hidden_states[i + 1]
  for (int64_t id : ds.captured_layer_ids()) hs.push_back(id + 1);
  auto list = [](const std::vector<int64_t>& v) {
    std::string out;
    for (int64_t k : v) out += (out.empty() ? "" : ", ") + std::to_string(k);
    return "[" + out + "]";
  };
  FSDP_USAGE_CHECK(
      hs == aux_layers->hidden_state_index,
      fsdp::str(flag, ": ", ds.root(), " holds target hidden_states ", list(hs), " (layer outputs ",
                list(ds.captured_layer_ids()), "), but the draft reads hidden_states ",
                list(aux_layers->hidden_state_index), " (", aux_layers->origin, ")"),
      "set eagle_aux_hidden_state_layer_ids in the draft config to the dump's "
      "layers, or use features dumped for this draft");
}

}  // namespace fsdp::algo
