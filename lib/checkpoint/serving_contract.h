// The serving contract of an EAGLE3 draft (docs/serving.md): which engines serve which draft as
// trained (the variants only vLLM builds, SGLang's fixed fc width), which engines a config.json
// is written for, and the trainer's start-up plan of its exports (target layers, RoPE, the engine
// each export is for). The one owner of these rules: the trainer and `check-export` both ask it.
// Torch-free and file-free apart from reading a checkpoint's aux_layers.json record; it never
// writes. The id conventions themselves are model/aux_layers.h's; the file names of an export
// are checkpoint/checkpoint_dir.h's layout.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/aux_layers.h"

namespace fsdp::checkpoint {

// SGLang's LlamaForCausalLMEagle3 builds fc over this many captured target layers whatever the
// config says; it is also the count every engine captures by default.
inline constexpr int64_t kSglangFcLayers = 3;

// The key of the captured target layers' ids: vLLM reads it at the top level of config.json,
// SGLang (and SpecForge's layout) in eagle_config.
inline constexpr const char* kAuxLayerIdsKey = "eagle_aux_hidden_state_layer_ids";
// Whether `obj` holds that key as a non-empty list; whether config.json's eagle_config does.
bool has_aux_layer_ids(const nlohmann::json& obj);
bool has_nested_aux_layer_ids(const nlohmann::json& cfg);

// The engines that must read a draft right.
struct ServingEngines {
  bool vllm = true;
  bool sglang = true;
};
// The engines `--for` names (kEngines: both; kSpecForge is not an engine: both).
ServingEngines engines_named(model::ExportTarget target);
// The engines a config.json was written for, from the keys it holds (check-export on its own
// exports): a vLLM-only variant or num_aux_hidden_states other than 3: vLLM; top-level aux ids
// only: vLLM; eagle_config's only: SGLang (the SpecForge layout); none: both; both keys: both,
// unless SGLang reads other layers than vLLM (then vLLM).
ServingEngines engines_from_config(const nlohmann::json& cfg);

// A draft-variant flag (fc_norm, norm_before_fc, norm_output, norm_before_residual) as vLLM 0.32
// reads it: norm_before_fc from eagle_config first, then the top level; the others at the top
// level. Anything but true is false.
bool variant_flag(const nlohmann::json& cfg, const std::string& key);
// The variants of docs/model.md "Draft variants" that only vLLM serves as trained (Qwen3 layers,
// more than one decoder layer, or a variant flag): e.g. "num_hidden_layers 2, fc_norm"; "" for a
// plain draft.
// SGLang builds one layer, fc over 3 layers, no fc norms and feeds the pre-norm state forward.
std::string vllm_only_variants(const nlohmann::json& cfg);

// What the trainer exports for serving, decided once at start-up.
struct ServingRequest {
  std::string draft_config_path;  // --draft-model-config (messages; its directory's record)
  std::string draft_config_json;  // the parsed draft config (model::DraftConfig::to_json)
  int64_t num_aux_hidden_states = kSglangFcLayers;  // the layers the draft's fc reads
  model::AuxIdConvention convention = model::AuxIdConvention::kLayerOutput;  // of the config's ids
  std::string target_model_path;
  model::ExportTarget export_for = model::ExportTarget::kEngines;  // --export-for
  std::string rope_scaling;                                        // --export-rope-scaling
  int64_t max_length = 0;  // --max-length (the RoPE shorthand's original length)
};

// One start-up line for rank 0 to log.
struct ServingNote {
  bool warn = false;
  std::string text;
};

struct ServingPlan {
  std::optional<model::AuxLayers> aux_layers;  // nullopt: the engines' default capture
  model::RopeOverride rope;
  model::ExportTarget export_for = model::ExportTarget::kEngines;
  std::vector<ServingNote> notes;  // what the plan means, in order
  // The draft's config.json as exported: each engine's aux ids, RoPE in both schemas.
  std::string config_json(const std::string& draft_config_json) const;
};

// Resolves the target layers (a checkpoint's own config.json next to its aux_layers.json is read
// in vLLM's convention whatever the request says) and the RoPE override, and checks that the
// engine the exports are for serves this draft as trained. Throws fsdp::UsageError naming the
// draft config and the flag to change.
ServingPlan plan_serving_export(const ServingRequest& request);

}  // namespace fsdp::checkpoint
