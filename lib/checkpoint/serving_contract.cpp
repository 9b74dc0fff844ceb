// The serving contract (checkpoint/serving_contract.h): the engines' rules, written once.
#include "checkpoint/serving_contract.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;

bool has_aux_layer_ids(const json& obj) {
  return obj.is_object() && obj.contains(kAuxLayerIdsKey) && obj.at(kAuxLayerIdsKey).is_array() &&
         !obj.at(kAuxLayerIdsKey).empty();
}

bool has_nested_aux_layer_ids(const json& cfg) {
  return cfg.contains("eagle_config") && has_aux_layer_ids(cfg.at("eagle_config"));
}

namespace {

constexpr const char* kAuxKey = kAuxLayerIdsKey;

// The convention of the draft config's ids. A checkpoint's own config.json (e.g.
// --init-checkpoint DIR --draft-model-config DIR/config.json): an export for vLLM mirrors the
// hidden-state indices into eagle_config, so its ids are in vLLM's convention whatever
// --aux-layer-convention says. The checkpoint's aux_layers.json records those indices: when both
// id lists equal them, that is what they mean.
model::AuxIdConvention config_convention(const ServingRequest& r) {
  try {
    const auto hs = model::read_aux_layers_record(
        std::filesystem::path(r.draft_config_path).parent_path().string());
    const auto cfg = json::parse(r.draft_config_json);
    if (hs && cfg.contains(kAuxKey) && cfg.at(kAuxKey) == *hs && cfg.contains("eagle_config") &&
        cfg.at("eagle_config").value(kAuxKey, json()) == json(*hs))
      return model::AuxIdConvention::kHiddenStateIndex;
  } catch (const std::exception&) {
    // Not a record this version wrote: the flag's convention applies.
  }
  return r.convention;
}

// The engines' defaults capture three layers, and SGLang builds fc for three: checked at
// start-up, not when the first export fails its check after hours of training.
void check_aux_count(const ServingRequest& r, const ServingPlan& p) {
  const int64_t n_aux = r.num_aux_hidden_states;
  if (n_aux == kSglangFcLayers) return;
  FSDP_USAGE_CHECK(p.aux_layers.has_value(),
                   fsdp::str(r.draft_config_path, ": fc reads ", n_aux,
                             " target layers but the config names none"),
                   "list them in eagle_config.eagle_aux_hidden_state_layer_ids (the layers the "
                   "features were dumped with)");
  FSDP_USAGE_CHECK(
      r.export_for == model::ExportTarget::kVllm || r.export_for == model::ExportTarget::kSpecForge,
      fsdp::str("a draft over ", n_aux, " target layers cannot be exported for ",
                model::export_target_name(r.export_for),
                ": SGLang's LlamaForCausalLMEagle3 always builds fc for 3"),
      "add --export-for vllm (vLLM reads num_aux_hidden_states)");
}

// SGLang builds none of the variants; SpecForge reads fc_norm as vLLM does but norm_output
// otherwise.
void check_variants(const ServingRequest& r, ServingPlan& p) {
  const json cfg = json::parse(r.draft_config_json);
  const std::string variants = vllm_only_variants(cfg);
  if (variants.empty()) return;
  const bool specforge_ok = variants == "fc_norm";
  FSDP_USAGE_CHECK(
      r.export_for == model::ExportTarget::kVllm ||
          (specforge_ok && r.export_for == model::ExportTarget::kSpecForge),
      fsdp::str(r.draft_config_path, " is a draft variant (", variants,
                ") that only vLLM serves as trained; exports for ",
                model::export_target_name(r.export_for), " would be served as another model"),
      "add --export-for vllm (docs/model.md 'Draft variants')");
  p.notes.push_back(
      {false, "draft variant: " + variants + " (docs/model.md 'Draft variants')" +
                  (variant_flag(cfg, "norm_output")
                       ? "; norm_output: the normed output feeds the next step, as vLLM and "
                         "speculators read the key (SpecForge 0.2.0 reads it otherwise)"
                       : "")});
}

std::string list_text(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t k : v) out += (out.empty() ? "" : ", ") + std::to_string(k);
  return out;
}

// What each engine will read from the export, checked here rather than found at serving.
void check_readings(const ServingRequest& r, ServingPlan& p) {
  if (!p.aux_layers) {
    p.notes.push_back(
        {true, r.draft_config_path +
                   " names no eagle_aux_hidden_state_layer_ids, and SpecForge's default layers are "
                   "not known for the target (num_hidden_layers in " +
                   r.target_model_path +
                   "/config.json missing, or below 7): the export names no layers, and the "
                   "engines use their default capture (SpecForge's default layers)"});
    return;
  }
  const model::AuxLayers& aux = *p.aux_layers;
  const size_t n = aux.hidden_state_index.size();
  FSDP_USAGE_CHECK(static_cast<int64_t>(n) == r.num_aux_hidden_states,
                   fsdp::str(aux.origin, ": ", n, " target layers, but the draft's fc reads ",
                             r.num_aux_hidden_states, " (num_aux_hidden_states)"),
                   "give as many layer ids as the features hold, the ones they were dumped with");
  const std::string exported = p.config_json(r.draft_config_json);
  const auto v = model::vllm_reads(exported), g = model::sglang_reads(exported, false);
  FSDP_CHECK(r.export_for == model::ExportTarget::kSglang ||
                 r.export_for == model::ExportTarget::kSpecForge ||
                 (v && *v == aux.hidden_state_index),
             "the export's config.json would make vLLM read other layers", "report this bug");
  p.notes.push_back(
      {false,
       "target layers: hidden_states [" + list_text(aux.hidden_state_index) + "] from " +
           aux.origin + "; exports are written for " + model::export_target_name(r.export_for) +
           (g && *g == aux.hidden_state_index ? ""
                                              : " (SGLang cannot read them: serve with vLLM)")});
}

}  // namespace

ServingEngines engines_named(model::ExportTarget target) {
  if (target == model::ExportTarget::kVllm) return {true, false};
  if (target == model::ExportTarget::kSglang) return {false, true};
  return {true, true};
}

ServingEngines engines_from_config(const json& cfg) {
  if (!vllm_only_variants(cfg).empty()) return {true, false};
  // num_aux_hidden_states other than 3 is vLLM's key for a draft SGLang cannot build.
  if (cfg.contains("num_aux_hidden_states") &&
      cfg.at("num_aux_hidden_states").is_number_integer() &&
      cfg.at("num_aux_hidden_states").get<int64_t>() != kSglangFcLayers)
    return {true, false};
  const bool top = has_aux_layer_ids(cfg), nested = has_nested_aux_layer_ids(cfg);
  if (top && !nested) return {true, false};
  if (!top && nested) return {false, true};
  if (!top) return {true, true};
  // Both keys: `export --for vllm` mirrors the ids into eagle_config for vLLM's fc size, also
  // when SGLang cannot read them; the SGLang reading is then a WARN of the check.
  try {
    const std::string text = cfg.dump();
    if (model::vllm_reads(text) != model::sglang_reads(text, /*legacy=*/false))
      return {true, false};
  } catch (const std::exception&) {  // malformed ids: the check reports them
  }
  return {true, true};
}

bool variant_flag(const json& cfg, const std::string& key) {
  auto is_true = [](const json& v) { return v.is_boolean() && v.get<bool>(); };
  if (key == "norm_before_fc" && cfg.contains("eagle_config") &&
      cfg.at("eagle_config").is_object() && cfg.at("eagle_config").contains(key))
    return is_true(cfg.at("eagle_config").at(key));
  return cfg.contains(key) && is_true(cfg.at(key));
}

std::string vllm_only_variants(const json& cfg) {
  std::string out;
  // Qwen3 layers: vLLM's qwen3_eagle3 model; SGLang's and SpecForge's EAGLE3 drafts are Llama.
  if (cfg.contains("architectures") &&
      cfg.at("architectures") == json::array({"Eagle3Qwen3ForCausalLM"}))
    out = "Qwen3 layers (Eagle3Qwen3ForCausalLM)";
  // P-EAGLE's export (docs/model.md "P-EAGLE"): the mask token of vLLM's parallel drafting.
  if (cfg.contains("mask_token_id") && cfg.at("mask_token_id").is_number_integer())
    out += str(out.empty() ? "" : ", ", "P-EAGLE (mask_token_id: parallel drafting)");
  if (cfg.contains("num_hidden_layers") && cfg.at("num_hidden_layers").is_number_integer() &&
      cfg.at("num_hidden_layers").get<int64_t>() > 1)
    out += str(out.empty() ? "" : ", ", "num_hidden_layers ",
               cfg.at("num_hidden_layers").get<int64_t>());
  for (const char* key : {"fc_norm", "norm_before_fc", "norm_output", "norm_before_residual"})
    if (variant_flag(cfg, key)) out += (out.empty() ? "" : ", ") + std::string(key);
  return out;
}

std::string ServingPlan::config_json(const std::string& draft_config_json) const {
  return model::serving_config_json(draft_config_json, aux_layers, export_for, rope);
}

ServingPlan plan_serving_export(const ServingRequest& r) {
  ServingPlan p;
  p.export_for = r.export_for;
  p.aux_layers =
      model::resolve_aux_layers(r.draft_config_json, config_convention(r),
                                model::target_num_layers(r.target_model_path), r.draft_config_path);
  p.rope = model::parse_rope_override(r.rope_scaling, r.max_length);
  check_aux_count(r, p);
  check_variants(r, p);
  check_readings(r, p);
  return p;
}

}  // namespace fsdp::checkpoint
