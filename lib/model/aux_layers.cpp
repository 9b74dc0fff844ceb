// Target-layer conventions and the serving config (aux_layers.h). Torch-free (JSON only); the
// engine readings mirror vLLM 0.32's and SGLang's loaders as docs/serving.md describes them.
#include "model/aux_layers.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fsdp::model {
namespace {

using json = nlohmann::ordered_json;
constexpr const char* kKey = "eagle_aux_hidden_state_layer_ids";

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

json parse_object(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  FSDP_USAGE_CHECK(j.is_object(), what + " is not a JSON object",
                   "give a draft config.json (an HF LlamaConfig-style JSON object)");
  return j;
}

// The id list under `key` of `obj`; nullopt when absent, null or empty. Throws for non-integers.
std::optional<std::vector<int64_t>> id_list(const json& obj, const std::string& where) {
  if (!obj.is_object() || !obj.contains(kKey) || obj.at(kKey).is_null()) return std::nullopt;
  const json& v = obj.at(kKey);
  FSDP_USAGE_CHECK(v.is_array(), where + "." + kKey + " must be a list of layer numbers",
                   "write e.g. [1, 13, 26]");
  if (v.empty()) return std::nullopt;
  std::vector<int64_t> out;
  for (const json& e : v) {
    FSDP_USAGE_CHECK(e.is_number_integer(),
                     where + "." + kKey + " holds " + e.dump() + ", not an integer",
                     "write whole layer numbers, e.g. [1, 13, 26]");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<int64_t> sorted_unique(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::vector<int64_t> shifted(std::vector<int64_t> v, int64_t by) {
  for (auto& x : v) x += by;
  return v;
}

}  // namespace

const char* convention_name(AuxIdConvention c) {
  return c == AuxIdConvention::kLayerOutput ? "layer-output" : "hidden-state-index";
}

std::optional<AuxIdConvention> parse_convention(const std::string& text) {
  if (text == "layer-output") return AuxIdConvention::kLayerOutput;
  if (text == "hidden-state-index") return AuxIdConvention::kHiddenStateIndex;
  return std::nullopt;
}

std::vector<int64_t> to_hidden_state_index(const std::vector<int64_t>& ids, AuxIdConvention c) {
  return c == AuxIdConvention::kLayerOutput ? shifted(ids, 1) : ids;
}

std::vector<int64_t> from_hidden_state_index(const std::vector<int64_t>& hs, AuxIdConvention c) {
  return c == AuxIdConvention::kLayerOutput ? shifted(hs, -1) : hs;
}

std::vector<int64_t> default_hidden_state_index(int64_t L) {
  return {2, L / 2, L - 3};
}

std::optional<AuxLayers> resolve_aux_layers(const std::string& config_json,
                                            AuxIdConvention convention, int64_t num_target_layers,
                                            const std::string& source) {
  const json cfg = parse_object(config_json, source);
  const auto top = id_list(cfg, source);
  const auto nested = cfg.contains("eagle_config")
                          ? id_list(cfg.at("eagle_config"), source + ": eagle_config")
                          : std::nullopt;
  AuxLayers out;
  if (nested) {
    out.hidden_state_index = to_hidden_state_index(*nested, convention);
    out.origin = source + ": eagle_config." + kKey + " " + list_text(*nested) + " (" +
                 convention_name(convention) + " convention)";
    if (top) {
      FSDP_USAGE_CHECK(*top == out.hidden_state_index,
                       source + ": " + kKey + " " + list_text(*top) +
                           " (hidden-state-index convention, vLLM's) and eagle_config." + kKey +
                           " " + list_text(*nested) + " (" + convention_name(convention) +
                           ") name different target layers",
                       "keep one of the two keys, or set --aux-layer-convention to the "
                       "convention of eagle_config's ids");
    }
  } else if (top) {
    out.hidden_state_index = *top;
    out.origin = source + ": " + kKey + " " + list_text(*top) + " (hidden-state-index convention)";
  } else if (num_target_layers > 0) {
    out.hidden_state_index = default_hidden_state_index(num_target_layers);
    // Below 7 layers the default names no three distinct layers (SpecForge's would index
    // negatively): such features came from elsewhere, and nothing is known of their layers.
    const auto& d = out.hidden_state_index;
    if (!(d[0] >= 0 && d[0] < d[1] && d[1] < d[2] && d[2] <= num_target_layers))
      return std::nullopt;
    out.origin =
        "SpecForge's default for a " + std::to_string(num_target_layers) +
        "-layer target (outputs of layers " +
        list_text(from_hidden_state_index(out.hidden_state_index, AuxIdConvention::kLayerOutput)) +
        ")";
  } else {
    return std::nullopt;
  }
  const auto& hs = out.hidden_state_index;
  for (size_t i = 0; i < hs.size(); ++i) {
    FSDP_USAGE_CHECK(
        hs[i] >= 0,
        out.origin + ": names hidden_states[" + std::to_string(hs[i]) + "], before the embedding",
        "check --aux-layer-convention: layer-output ids start at 0");
    FSDP_USAGE_CHECK(i == 0 || hs[i] > hs[i - 1],
                     out.origin + ": the ids are not strictly ascending",
                     "vLLM and SGLang capture the layers in ascending order and concatenate them "
                     "so; list them ascending, in the order the features hold them");
    FSDP_USAGE_CHECK(num_target_layers <= 0 || hs[i] <= num_target_layers,
                     out.origin + ": names hidden_states[" + std::to_string(hs[i]) +
                         "], but the target has " + std::to_string(num_target_layers) +
                         " decoder layers (hidden_states 0.." + std::to_string(num_target_layers) +
                         ")",
                     "check the ids and --aux-layer-convention against the target model");
  }
  return out;
}

int64_t target_num_layers(const std::string& model_dir) {
  std::ifstream f(model_dir + "/config.json");
  if (!f) return 0;
  const json cfg = json::parse(f, nullptr, /*allow_exceptions=*/false);
  for (const json* c :
       {&cfg, cfg.is_object() && cfg.contains("text_config") ? &cfg.at("text_config")
                                                             : static_cast<const json*>(nullptr)}) {
    if (c && c->is_object() && c->contains("num_hidden_layers") &&
        c->at("num_hidden_layers").is_number_integer())
      return c->at("num_hidden_layers").get<int64_t>();
  }
  return 0;
}

std::string aux_layers_record(const AuxLayers& aux) {
  json j;
  j["hidden_state_index"] = aux.hidden_state_index;
  j["layer_output_ids"] =
      from_hidden_state_index(aux.hidden_state_index, AuxIdConvention::kLayerOutput);
  j["vllm_ids"] = aux.hidden_state_index;
  const auto sg = sglang_ids(aux.hidden_state_index);
  j["sglang_ids"] = sg ? json(*sg) : json();
  j["origin"] = aux.origin;
  return j.dump(2) + "\n";
}

std::optional<std::vector<int64_t>> read_aux_layers_record(const std::string& dir) {
  const std::string path = dir + "/aux_layers.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  FSDP_USAGE_CHECK(
      j.is_object() && j.contains("hidden_state_index") && j.at("hidden_state_index").is_array(),
      path + " is not an aux-layer record", "use another checkpoint");
  try {
    return j.at("hidden_state_index").get<std::vector<int64_t>>();
  } catch (const json::exception&) {
    FSDP_USAGE_FAIL(path + " is not an aux-layer record", "use another checkpoint");
  }
  return std::nullopt;
}

std::optional<std::vector<int64_t>> vllm_reads(const std::string& config_json) {
  const json cfg = parse_object(config_json, "config.json");
  auto ids = id_list(cfg, "config.json");
  if (!ids && cfg.contains("eagle_config")) ids = id_list(cfg.at("eagle_config"), "eagle_config");
  if (!ids) return std::nullopt;
  return sorted_unique(*ids);
}

std::optional<std::vector<int64_t>> sglang_reads(const std::string& config_json, bool legacy) {
  const json cfg = parse_object(config_json, "config.json");
  if (!cfg.contains("eagle_config")) return std::nullopt;
  auto ids = id_list(cfg.at("eagle_config"), "eagle_config");
  if (!ids) return std::nullopt;
  const bool add_one = legacy || ids->front() == 1;
  // SGLang's capture loop appends in layer order whatever order the list has.
  return sorted_unique(add_one ? shifted(*ids, 1) : *ids);
}

std::optional<std::vector<int64_t>> sglang_ids(const std::vector<int64_t>& hs) {
  if (hs.empty()) return hs;
  if (hs.front() == 2) return shifted(hs, -1);
  if (hs.front() == 1) return std::nullopt;
  return hs;
}

const char* export_target_name(ExportTarget t) {
  switch (t) {
    case ExportTarget::kEngines:
      return "engines";
    case ExportTarget::kVllm:
      return "vllm";
    case ExportTarget::kSglang:
      return "sglang";
    case ExportTarget::kSpecForge:
      return "specforge";
  }
  return "?";
}

std::optional<ExportTarget> parse_export_target(const std::string& text) {
  for (ExportTarget t : {ExportTarget::kEngines, ExportTarget::kVllm, ExportTarget::kSglang,
                         ExportTarget::kSpecForge}) {
    if (text == export_target_name(t)) return t;
  }
  return std::nullopt;
}

RopeOverride parse_rope_override(const std::string& text, int64_t train_length) {
  RopeOverride out;
  if (text.empty() || text == "none") return out;
  json rs;
  if (text.rfind("yarn:", 0) == 0) {
    char* end = nullptr;
    const double factor = std::strtod(text.c_str() + 5, &end);
    FSDP_USAGE_CHECK(end && *end == '\0' && std::isfinite(factor) && factor > 1.0,
                     "--export-rope-scaling " + text +
                         ": the factor after 'yarn:' must be a "
                         "number above 1",
                     "write e.g. --export-rope-scaling yarn:32");
    FSDP_USAGE_CHECK(
        train_length > 0,
        "--export-rope-scaling " + text + ": the training length (--max-length) is unknown",
        "give the JSON form with original_max_position_embeddings");
    rs = {{"rope_type", "yarn"},
          {"factor", factor},
          {"original_max_position_embeddings", train_length}};
  } else {
    rs = json::parse(text, nullptr, /*allow_exceptions=*/false);
    FSDP_USAGE_CHECK(
        rs.is_object() && (rs.contains("rope_type") || rs.contains("type")),
        "--export-rope-scaling " + text + ": not 'yarn:<factor>' nor a JSON object with rope_type",
        "write e.g. --export-rope-scaling yarn:32 or '{\"rope_type\": \"yarn\", "
        "\"factor\": 32, \"original_max_position_embeddings\": 2048}'");
    if (!rs.contains("rope_type")) rs["rope_type"] = rs.at("type");
    const json& f = rs.contains("factor") ? rs.at("factor") : json();
    FSDP_USAGE_CHECK(
        rs.at("rope_type").is_string() && f.is_number() && f.get<double>() >= 1.0,
        "--export-rope-scaling " + text + ": rope_type must be a string and factor a number >= 1",
        "write e.g. '{\"rope_type\": \"yarn\", \"factor\": 32}'");
  }
  out.rope_scaling_json = rs.dump();
  return out;
}

std::string serving_config_json(const std::string& config_json, const std::optional<AuxLayers>& aux,
                                ExportTarget target, const RopeOverride& rope) {
  json cfg = parse_object(config_json, "the draft config");
  // Aux ids: each engine's key in its own convention.
  cfg.erase(kKey);
  if (cfg.contains("eagle_config") && cfg.at("eagle_config").is_object())
    cfg["eagle_config"].erase(kKey);
  if (aux) {
    const auto& hs = aux->hidden_state_index;
    std::optional<std::vector<int64_t>> nested;
    bool top = false;
    switch (target) {
      case ExportTarget::kEngines:
        top = true;
        nested = sglang_ids(hs);
        break;
      case ExportTarget::kVllm:
        top = true;
        nested = hs;
        break;
      case ExportTarget::kSglang:
        nested = sglang_ids(hs);
        FSDP_USAGE_CHECK(nested.has_value(),
                         aux->origin +
                             ": the first aux layer is hidden_states[1] (the output of "
                             "layer 0), which no SGLang reading of "
                             "eagle_aux_hidden_state_layer_ids can name",
                         "serve this draft with vLLM (--for vllm), or train on other layers");
        break;
      case ExportTarget::kSpecForge:
        nested = from_hidden_state_index(hs, AuxIdConvention::kLayerOutput);
        break;
    }
    if (top) cfg[kKey] = hs;
    if (nested) {
      if (!cfg.contains("eagle_config") || !cfg.at("eagle_config").is_object())
        cfg["eagle_config"] = json::object();
      cfg["eagle_config"][kKey] = *nested;
    }
  }
  if (cfg.contains("eagle_config") && cfg.at("eagle_config").is_object() &&
      cfg.at("eagle_config").empty())
    cfg.erase("eagle_config");
  // RoPE in both schemas: v4 rope_theta + rope_scaling, v5 rope_parameters (rope_theta inside).
  const double theta = cfg.contains("rope_theta") && cfg.at("rope_theta").is_number()
                           ? cfg.at("rope_theta").get<double>()
                       : cfg.contains("rope_parameters") && cfg.at("rope_parameters").is_object() &&
                               cfg.at("rope_parameters").contains("rope_theta")
                           ? cfg.at("rope_parameters").at("rope_theta").get<double>()
                           : 10000.0;
  json scaling = cfg.contains("rope_scaling") ? cfg.at("rope_scaling") : json();
  if (!rope.rope_scaling_json.empty()) scaling = json::parse(rope.rope_scaling_json);
  if (scaling.is_object() && !scaling.contains("rope_type") && scaling.contains("type"))
    scaling["rope_type"] = scaling.at("type");
  cfg["rope_theta"] = theta;
  cfg["rope_scaling"] = scaling;
  json params = scaling.is_object() ? scaling : json{{"rope_type", "default"}};
  params.erase("type");
  params["rope_theta"] = theta;
  cfg["rope_parameters"] = params;
  if (!rope.rope_scaling_json.empty() && scaling.contains("original_max_position_embeddings") &&
      scaling.at("original_max_position_embeddings").is_number_integer()) {
    const auto extended = static_cast<int64_t>(
        std::llround(scaling.at("factor").get<double>() *
                     scaling.at("original_max_position_embeddings").get<double>()));
    const int64_t now = cfg.contains("max_position_embeddings") &&
                                cfg.at("max_position_embeddings").is_number_integer()
                            ? cfg.at("max_position_embeddings").get<int64_t>()
                            : 0;
    cfg["max_position_embeddings"] = std::max(now, extended);
  }
  return cfg.dump(2) + "\n";
}

}  // namespace fsdp::model
