// Parsing, validation and saving of the draft config JSON (docs/reference.md §1.1). Kept free of
// torch headers so it compiles in a second; never accepts a value the model would misinterpret.
#include "model/draft_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "model/memory_estimate.h"

namespace fsdp::model {
namespace {

using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

bool is_eagle3_architecture(const std::string& a) {
  return a == kEagle3LlamaArchitecture || a == kEagle3Qwen3Architecture;
}

// Error helpers: every message names the key and where the config came from.
[[noreturn]] void bad_key(const std::string& source, const std::string& key,
                          const std::string& what, const std::string& hint) {
  throw_usage_error(__FILE__, __LINE__, str("draft config ", source, ": key '", key, "' ", what),
                    hint);
}

int64_t get_int(const json& j, const std::string& key, const std::string& source) {
  const json& v = j.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  bad_key(source, key, str("must be an integer, got ", v.dump()),
          "write a whole number, e.g. \"" + key + "\": 4096");
}

double get_double(const json& j, const std::string& key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_number()) {
    bad_key(source, key, str("must be a number, got ", v.dump()), "write a number, e.g. 1e-05");
  }
  return v.get<double>();
}

std::string get_string(const json& j, const std::string& key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_string()) {
    bad_key(source, key, str("must be a string, got ", v.dump()), "quote the value");
  }
  return v.get<std::string>();
}

bool present(const json& j, const std::string& key) {
  return j.contains(key) && !j.at(key).is_null();
}

int64_t require_int(const json& j, const std::string& key, const std::string& source) {
  if (!present(j, key)) {
    bad_key(source, key, "is missing",
            "add it to the config (the HF LlamaConfig of your draft model has it)");
  }
  return get_int(j, key, source);
}

RopeScaling parse_rope_scaling(const json& rs, const DraftConfig& cfg) {
  const std::string& src = cfg.source;
  if (!rs.is_object()) {
    bad_key(src, "rope_scaling", str("must be null or an object, got ", rs.dump()),
            "use null, or {\"rope_type\": \"linear\", \"factor\": 2.0}");
  }
  std::string type;
  if (present(rs, "rope_type")) {
    type = get_string(rs, "rope_type", src);
  } else if (present(rs, "type")) {
    type = get_string(rs, "type", src);
  } else {
    bad_key(src, "rope_scaling", "has no 'rope_type' (or 'type')",
            "set rope_type to one of default, linear, llama3, yarn");
  }
  RopeScaling out;
  if (type == "default") {
    out.type = RopeType::kDefault;
  } else if (type == "linear") {
    out.type = RopeType::kLinear;
  } else if (type == "llama3") {
    out.type = RopeType::kLlama3;
  } else if (type == "yarn") {
    out.type = RopeType::kYarn;
  } else {
    bad_key(src, "rope_scaling.rope_type", str("'", type, "' is not supported"),
            "use one of default, linear, llama3, yarn (or null for no scaling)");
  }
  auto num = [&](const char* k) { return get_double(rs, k, src); };
  if (out.type != RopeType::kDefault) {
    if (!present(rs, "factor")) {
      bad_key(src, "rope_scaling.factor", str("is missing (required for ", type, ")"),
              "add \"factor\": <scale >= 1>");
    }
    out.factor = num("factor");
    if (!(out.factor >= 1.0)) {
      bad_key(src, "rope_scaling.factor", str("must be >= 1, got ", out.factor),
              "use the factor of the target model's rope_scaling");
    }
  }
  if (present(rs, "original_max_position_embeddings")) {
    out.original_max_position_embeddings = get_int(rs, "original_max_position_embeddings", src);
  }
  if (out.type == RopeType::kLlama3) {
    for (const char* k :
         {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!present(rs, k)) {
        bad_key(src, str("rope_scaling.", k), "is missing (required for llama3)",
                "copy rope_scaling from the target model's config.json");
      }
    }
    out.low_freq_factor = num("low_freq_factor");
    out.high_freq_factor = num("high_freq_factor");
    if (!(out.high_freq_factor > out.low_freq_factor)) {
      bad_key(src, "rope_scaling.high_freq_factor", "must be greater than low_freq_factor",
              "copy rope_scaling from the target model's config.json");
    }
  }
  if (out.type == RopeType::kYarn) {
    if (present(rs, "beta_fast")) out.beta_fast = num("beta_fast");
    if (present(rs, "beta_slow")) out.beta_slow = num("beta_slow");
    if (present(rs, "attention_factor")) out.attention_factor = num("attention_factor");
    if (present(rs, "mscale")) out.mscale = num("mscale");
    if (present(rs, "mscale_all_dim")) out.mscale_all_dim = num("mscale_all_dim");
    if (present(rs, "truncate")) {
      if (!rs.at("truncate").is_boolean()) {
        bad_key(src, "rope_scaling.truncate", "must be true or false", "write true or false");
      }
      out.truncate = rs.at("truncate").get<bool>();
    }
    if (!(out.beta_fast > out.beta_slow)) {
      bad_key(src, "rope_scaling.beta_fast", "must be greater than beta_slow",
              "copy rope_scaling from the target model's config.json");
    }
  }
  if (out.original_max_position_embeddings < 0) {
    bad_key(src, "rope_scaling.original_max_position_embeddings", "must be positive",
            "copy rope_scaling from the target model's config.json");
  }
  return out;
}

const std::set<std::string>& known_keys() {
  static const std::set<std::string> keys = {"architectures",
                                             "hidden_size",
                                             "intermediate_size",
                                             "num_attention_heads",
                                             "num_key_value_heads",
                                             "head_dim",
                                             "num_hidden_layers",
                                             "vocab_size",
                                             "draft_vocab_size",
                                             "rms_norm_eps",
                                             "max_position_embeddings",
                                             "rope_theta",
                                             "rope_scaling",
                                             "rope_parameters",
                                             "hidden_act",
                                             "pad_token_id",
                                             "target_hidden_size",
                                             "num_aux_hidden_states",
                                             "eagle_config",
                                             "tie_word_embeddings",
                                             "torch_dtype",
                                             "fc_norm",
                                             "norm_before_fc",
                                             "norm_output",
                                             "norm_before_residual"};
  return keys;
}

// transformers v5 writes RoPE as rope_parameters {rope_type, rope_theta, factor, ...}; v4 as
// rope_theta + rope_scaling. Either alone is taken; both must agree (a config edited in one schema
// only would otherwise train with the other's values).
void read_rope_parameters(const json& j, DraftConfig& cfg) {
  const std::string& src = cfg.source;
  const json& rp = j.at("rope_parameters");
  if (!rp.is_object()) {
    bad_key(src, "rope_parameters", str("must be null or an object, got ", rp.dump()),
            "copy rope_parameters from the target model's config.json");
  }
  if (rp.contains("rope_theta")) {
    const double theta = get_double(rp, "rope_theta", src);
    if (present(j, "rope_theta") && theta != cfg.rope_theta) {
      bad_key(src, "rope_parameters.rope_theta",
              str("is ", theta, " but rope_theta is ", cfg.rope_theta),
              "keep one value (the target model's) in both keys, or drop one of them");
    }
    cfg.rope_theta = theta;
  }
  json scaling = rp;
  scaling.erase("rope_theta");
  const std::string type = rp.contains("rope_type") && rp.at("rope_type").is_string()
                               ? rp.at("rope_type").get<std::string>()
                           : rp.contains("type") && rp.at("type").is_string()
                               ? rp.at("type").get<std::string>()
                               : "default";
  const RopeScaling from_params =
      type == "default" ? RopeScaling{} : parse_rope_scaling(scaling, cfg);
  if (present(j, "rope_scaling")) {
    const RopeScaling& v4 = cfg.rope_scaling;
    if (v4.type != from_params.type || v4.factor != from_params.factor ||
        v4.original_max_position_embeddings != from_params.original_max_position_embeddings) {
      bad_key(src, "rope_parameters",
              str("says ", type, " (factor ", from_params.factor, ") but rope_scaling says ",
                  rope_type_name(v4.type), " (factor ", v4.factor, ")"),
              "keep one RoPE scaling (the target model's) in both keys, or drop one of them");
    }
    return;
  }
  if (type != "default") {
    cfg.rope_scaling = from_params;
    cfg.rope_scaling_json = scaling.dump();
  }
}

// n, the captured layers fc reads (DraftConfig::num_aux_hidden_states), as vLLM decides it; the
// id lists and an explicit count must agree (SGLang reads 3 regardless: docs/serving.md).
void read_num_aux_hidden_states(const json& j, DraftConfig& cfg) {
  const std::string& src = cfg.source;
  auto ids_length = [&](const json& o, const char* where) -> int64_t {
    if (!o.is_object() || !present(o, "eagle_aux_hidden_state_layer_ids")) return 0;
    const json& ids = o.at("eagle_aux_hidden_state_layer_ids");
    if (!ids.is_array()) {
      bad_key(src, where, "must be a list of layer ids",
              "write e.g. \"eagle_aux_hidden_state_layer_ids\": [1, 13, 24]");
    }
    return static_cast<int64_t>(ids.size());
  };
  const int64_t nested =
      present(j, "eagle_config") ? ids_length(j.at("eagle_config"), "eagle_config") : 0;
  const int64_t top = ids_length(j, "eagle_aux_hidden_state_layer_ids");
  const int64_t from_ids = nested > 0 ? nested : top;
  if (present(j, "num_aux_hidden_states")) {
    cfg.num_aux_hidden_states = get_int(j, "num_aux_hidden_states", src);
    cfg.num_aux_hidden_states_given = true;
    if (cfg.num_aux_hidden_states < 1 || cfg.num_aux_hidden_states > 64) {
      bad_key(src, "num_aux_hidden_states",
              str("is ", cfg.num_aux_hidden_states, ", not in [1, 64]"),
              "give the number of captured target layers fc reads, e.g. 3");
    }
    if (from_ids > 0 && from_ids != cfg.num_aux_hidden_states) {
      bad_key(src, "num_aux_hidden_states",
              str("is ", cfg.num_aux_hidden_states, " but eagle_aux_hidden_state_layer_ids names ",
                  from_ids, " layers"),
              "make the count and the id list agree (or drop num_aux_hidden_states)");
    }
  } else if (from_ids > 0) {
    cfg.num_aux_hidden_states = from_ids;
  }
}

// The draft-variant flags: a boolean (or null = false) at the top level and/or in eagle_config.
// vLLM reads fc_norm, norm_output and norm_before_residual at the top level and norm_before_fc in
// eagle_config first; speculators' converter reads eagle_config. A file where the two places
// disagree has no single meaning and is refused.
void read_variant_flags(const json& j, DraftConfig& cfg) {
  const std::string& src = cfg.source;
  const json* eagle = present(j, "eagle_config") && j.at("eagle_config").is_object()
                          ? &j.at("eagle_config")
                          : nullptr;
  auto as_flag = [&](const json& v, const std::string& where) -> bool {
    if (v.is_null()) return false;
    if (!v.is_boolean())
      bad_key(src, where, str("must be true or false, got ", v.dump()),
              str("write \"", where, "\": true or false"));
    return v.get<bool>();
  };
  for (auto [key, field] : {std::pair<const char*, bool*>{"fc_norm", &cfg.fc_norm},
                            {"norm_before_fc", &cfg.norm_before_fc},
                            {"norm_output", &cfg.norm_output},
                            {"norm_before_residual", &cfg.norm_before_residual}}) {
    const bool top = j.contains(key), nested = eagle && eagle->contains(key);
    if (!top && !nested) continue;
    const bool t = top && as_flag(j.at(key), key);
    const bool n = nested && as_flag(eagle->at(key), str("eagle_config.", key));
    if (top && nested && t != n) {
      bad_key(src, key,
              str("is ", t ? "true" : "false", " but eagle_config.", key, " is ",
                  n ? "true" : "false", "; engines read one or the other"),
              "give the key once, or the same value in both places");
    }
    *field = top ? t : n;
    cfg.variant_keys_given.emplace_back(key);
  }
}

// Qwen3 layers (Eagle3Qwen3ForCausalLM): the keys vLLM's qwen3_eagle3 model reads beyond the
// Llama ones. model_type picks Qwen3Config in the engine; sliding-window layers are built by
// vLLM from layer_types but not trained here, so they are refused rather than exported.
void read_qwen3_keys(const json& j, DraftConfig& cfg) {
  const std::string& src = cfg.source;
  if (present(j, "model_type") && j.at("model_type") != json("qwen3")) {
    bad_key(src, "model_type",
            str("is ", j.at("model_type").dump(), " but architectures is [\"",
                kEagle3Qwen3Architecture, "\"] (Qwen3 layers)"),
            str("write \"model_type\": \"qwen3\", or architectures [\"", kEagle3LlamaArchitecture,
                "\"] for Llama layers"));
  }
  if (present(j, "use_sliding_window") && j.at("use_sliding_window") != json(false)) {
    bad_key(src, "use_sliding_window",
            str("is ", j.at("use_sliding_window").dump(),
                ": sliding-window attention in an EAGLE3 draft is not trained by fsdp-train"),
            "write \"use_sliding_window\": false (every layer full attention)");
  }
  if (present(j, "layer_types")) {
    const json& types = j.at("layer_types");
    const bool all_full =
        types.is_array() && std::all_of(types.begin(), types.end(),
                                        [](const json& t) { return t == json("full_attention"); });
    if (!all_full) {
      bad_key(
          src, "layer_types",
          str("is ", types.dump(), ": only full-attention layers are trained in an EAGLE3 draft"),
          "remove the key, or list \"full_attention\" for every layer");
    }
  }
}

}  // namespace

std::string rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

DraftConfig parse_draft_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw_usage_error(__FILE__, __LINE__,
                      str("draft config ", source, " is not valid JSON: ", e.what()),
                      "fix the syntax (a JSON linter such as `python -m json.tool` shows where)");
  }
  FSDP_USAGE_CHECK(j.is_object(), str("draft config ", source, " must be a JSON object"),
                   "the file should look like an HF config.json: {\"hidden_size\": ..., ...}");
  DraftConfig cfg;
  cfg.source = source;

  if (!present(j, "architectures")) {
    bad_key(source, "architectures", "is missing",
            str("add \"architectures\": [\"", kEagle3LlamaArchitecture, "\"]"));
  }
  const json& arch = j.at("architectures");
  if (!arch.is_array() || arch.size() != 1 || !arch[0].is_string() ||
      !is_eagle3_architecture(arch[0].get<std::string>())) {
    bad_key(source, "architectures",
            str("must be [\"", kEagle3LlamaArchitecture, "\"] (Llama layers) or [\"",
                kEagle3Qwen3Architecture, "\"] (Qwen3 layers), got ", arch.dump()),
            "use a SpecForge EAGLE3 config (configs/models/ has working ones)");
  }
  cfg.architectures = {arch[0].get<std::string>()};
  cfg.qk_norm = cfg.architectures[0] == kEagle3Qwen3Architecture;
  if (cfg.qk_norm) read_qwen3_keys(j, cfg);
  cfg.hidden_size = require_int(j, "hidden_size", source);
  cfg.intermediate_size = require_int(j, "intermediate_size", source);
  cfg.num_attention_heads = require_int(j, "num_attention_heads", source);
  cfg.vocab_size = require_int(j, "vocab_size", source);
  cfg.num_key_value_heads = present(j, "num_key_value_heads")
                                ? get_int(j, "num_key_value_heads", source)
                                : cfg.num_attention_heads;
  if (present(j, "head_dim")) cfg.head_dim = get_int(j, "head_dim", source);
  if (cfg.qk_norm && !cfg.head_dim) cfg.head_dim = kQwen3DefaultHeadDim;  // as Qwen3Config
  if (present(j, "num_hidden_layers"))
    cfg.num_hidden_layers = get_int(j, "num_hidden_layers", source);
  if (present(j, "draft_vocab_size")) cfg.draft_vocab_size = get_int(j, "draft_vocab_size", source);
  if (present(j, "rms_norm_eps")) cfg.rms_norm_eps = get_double(j, "rms_norm_eps", source);
  if (present(j, "max_position_embeddings")) {
    cfg.max_position_embeddings = get_int(j, "max_position_embeddings", source);
  }
  if (present(j, "rope_theta")) cfg.rope_theta = get_double(j, "rope_theta", source);
  if (present(j, "initializer_range")) {
    cfg.initializer_range = get_double(j, "initializer_range", source);
  }
  if (present(j, "rope_scaling")) {
    cfg.rope_scaling = parse_rope_scaling(j.at("rope_scaling"), cfg);
    cfg.rope_scaling_json = j.at("rope_scaling").dump();
  }
  if (present(j, "rope_parameters")) read_rope_parameters(j, cfg);
  if (present(j, "hidden_act")) cfg.hidden_act = get_string(j, "hidden_act", source);
  if (present(j, "pad_token_id")) cfg.pad_token_id = get_int(j, "pad_token_id", source);
  if (present(j, "target_hidden_size")) {
    cfg.target_hidden_size = get_int(j, "target_hidden_size", source);
  }
  if (present(j, "eagle_config")) cfg.eagle_config_json = j.at("eagle_config").dump();
  read_num_aux_hidden_states(j, cfg);
  read_variant_flags(j, cfg);
  if (present(j, "tie_word_embeddings")) {
    const json& t = j.at("tie_word_embeddings");
    if (!t.is_boolean()) {
      bad_key(source, "tie_word_embeddings", "must be true or false", "write false");
    }
    if (t.get<bool>()) {
      FSDP_LOG0(kWarn)
          << "draft config " << source
          << ": tie_word_embeddings=true ignored (the EAGLE3 draft has its own lm_head "
             "over the draft vocabulary)";
    }
  }
  cfg.tie_word_embeddings = false;
  if (present(j, "torch_dtype")) cfg.torch_dtype = get_string(j, "torch_dtype", source);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known_keys().count(it.key())) cfg.extra_json[it.key()] = it.value().dump();
  }
  cfg.validate();
  return cfg;
}

DraftConfig load_draft_config(const std::string& path) {
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), str("cannot open draft config ", path),
                   "check --draft-model-config (shipped configs are in configs/models/)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_draft_config(ss.str(), path);
}

namespace {
// No size above 2^31, and the trainable parameters' least memory (14 bytes each: fp32 master,
// Adam moments, bf16 copy) within `memory_bytes` (0: unknown). The run's whole estimate, with
// activations, is checked when the trainer knows its device (model/memory_estimate.h).
void check_fits_in_memory(const DraftConfig& c, uint64_t memory_bytes) {
  const std::string& source = c.source;
  const int64_t hidden_size = c.hidden_size, intermediate_size = c.intermediate_size;
  // No single size may exceed 2^31 (no real model comes near; the products of the model's
  // shapes then stay far inside int64).
  const std::pair<const char*, int64_t> sizes[] = {
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"vocab_size", c.vocab_size},
      {"draft_vocab_size", c.draft_vocab()},
      {"head_dim", c.head_dim_value()},
      {"target_hidden_size", c.target_hidden_size ? *c.target_hidden_size : hidden_size},
      {"max_position_embeddings", c.max_position_embeddings}};
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  for (const auto& [key, v] : sizes) {
    if (v > kMaxDim) {
      bad_key(source, key, str("is ", v, ", more than any model has (at most ", kMaxDim, ")"),
              "fix the value (the target model's config.json has the real sizes)");
    }
  }
  using LD = long double;
  const LD params = trainable_parameter_count(c);
  // Per trainable parameter at the least: fp32 master weight (4), Adam moments (8) and the
  // bf16 compute copy (2); fp32 compute adds 2 more.
  const LD bytes = params * 14;
  if (memory_bytes > 0 && bytes > static_cast<LD>(memory_bytes)) {
    throw_usage_error(
        __FILE__, __LINE__,
        str("draft config ", source, ": ", static_cast<double>(params),
            " trainable parameters (hidden_size ", hidden_size, ", intermediate_size ",
            intermediate_size, ", draft_vocab_size ", c.draft_vocab(), ") need at least ",
            format_gib(bytes),
            " (14 bytes each: fp32 master weight, Adam moments, bf16 copy), more "
            "than this host's ",
            format_gib(static_cast<LD>(memory_bytes)), " of memory"),
        "fix the sizes in the draft config (an EAGLE3 draft of an 8B target has about 0.4e9 "
        "trainable parameters); configs/models/ has working ones");
  }
}
}  // namespace

namespace {

void positive(const DraftConfig& c, const char* key, int64_t v) {
  if (v <= 0) bad_key(c.source, key, str("must be positive, got ", v), "fix the value");
}

void check_architecture_and_sizes(const DraftConfig& c) {
  FSDP_USAGE_CHECK(c.architectures.size() == 1 && is_eagle3_architecture(c.architectures[0]) &&
                       c.qk_norm == (c.architectures[0] == kEagle3Qwen3Architecture),
                   str("draft config ", c.source, ": key 'architectures' must be [\"",
                       kEagle3LlamaArchitecture, "\"] or [\"", kEagle3Qwen3Architecture, "\"]"),
                   "use a SpecForge EAGLE3 draft config");
  positive(c, "hidden_size", c.hidden_size);
  positive(c, "intermediate_size", c.intermediate_size);
  positive(c, "num_attention_heads", c.num_attention_heads);
  positive(c, "num_key_value_heads", c.num_key_value_heads);
  positive(c, "vocab_size", c.vocab_size);
  positive(c, "max_position_embeddings", c.max_position_embeddings);
}

// The decoder layers and the fc variants (docs/model.md "Draft variants").
void check_layers(const DraftConfig& c) {
  if (c.num_hidden_layers < 1 || c.num_hidden_layers > 64) {
    bad_key(c.source, "num_hidden_layers", str("is ", c.num_hidden_layers, ", not in [1, 64]"),
            "EAGLE3 drafts have one decoder layer (\"num_hidden_layers\": 1) or a few");
  }
  if (c.fc_norm && c.norm_before_fc) {
    bad_key(c.source, "norm_before_fc",
            "and fc_norm are both true: one RMSNorm over all captured layers and one per layer "
            "are alternatives (speculators refuses the pair too)",
            "keep fc_norm (EAGLE3.1) or norm_before_fc, not both");
  }
}

// Grouped-query attention with whole groups and an even (rotary) head dimension.
void check_attention_shape(const DraftConfig& c) {
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    bad_key(c.source, "num_key_value_heads",
            str("(", c.num_key_value_heads, ") must divide num_attention_heads (",
                c.num_attention_heads, ")"),
            "grouped-query attention needs whole groups");
  }
  if (c.head_dim) {
    positive(c, "head_dim", *c.head_dim);
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    bad_key(c.source, "hidden_size",
            str("(", c.hidden_size, ") is not divisible by num_attention_heads (",
                c.num_attention_heads, ")"),
            "set \"head_dim\" explicitly");
  }
  if (c.head_dim_value() % 2 != 0) {
    bad_key(c.source, c.head_dim ? "head_dim" : "hidden_size",
            str("gives an odd head dimension ", c.head_dim_value()),
            "rotary embedding needs an even head_dim");
  }
}

// The draft vocabulary (a subset of the target's) and the target's hidden width.
void check_vocab_and_target_width(const DraftConfig& c) {
  if (c.draft_vocab_size) {
    positive(c, "draft_vocab_size", *c.draft_vocab_size);
    if (*c.draft_vocab_size > c.vocab_size) {
      bad_key(c.source, "draft_vocab_size",
              str("(", *c.draft_vocab_size, ") exceeds vocab_size (", c.vocab_size, ")"),
              "the draft vocabulary is a subset of the target vocabulary");
    }
  }
  if (c.target_hidden_size) positive(c, "target_hidden_size", *c.target_hidden_size);
}

void check_scalars(const DraftConfig& c) {
  if (!(c.rms_norm_eps > 0)) bad_key(c.source, "rms_norm_eps", "must be > 0", "use e.g. 1e-05");
  if (!(c.rope_theta > 0)) bad_key(c.source, "rope_theta", "must be > 0", "use e.g. 10000");
  if (!(c.initializer_range > 0) || !std::isfinite(c.initializer_range))
    bad_key(c.source, "initializer_range", "must be a positive number", "use e.g. 0.02");
  if (c.hidden_act != "silu") {
    bad_key(c.source, "hidden_act", str("is '", c.hidden_act, "'; only 'silu' is supported"),
            "set \"hidden_act\": \"silu\"");
  }
}

// Keys that change the model and are not implemented here: trained as plain EAGLE3 they would
// be exported as they are, and an engine would build (and look for weights of) parts that were
// never trained. Refused by name (docs/model.md lists which keys are which).
void check_untrained_keys(const DraftConfig& c) {
  // The draft's projections have no bias terms; a config saying otherwise would be exported
  // as is and make the serving engine look for bias weights that were never trained.
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    const auto it = c.extra_json.find(key);
    // Anything but false, 0 or null would make Hugging Face's config truthy.
    if (it != c.extra_json.end() && it->second != "false" && it->second != "0" &&
        it->second != "null")
      bad_key(c.source, key, str("is ", it->second, ", but the EAGLE3 draft has no bias terms"),
              str("write \"", key, "\": false"));
  }
  const auto scale = c.extra_json.find("logit_scale");
  if (scale != c.extra_json.end() && scale->second != "1" && scale->second != "1.0" &&
      scale->second != "null")
    bad_key(c.source, "logit_scale",
            str("is ", scale->second,
                " (vLLM scales the draft's logits by it), which fsdp-train "
                "does not train"),
            "remove the key (or write 1.0)");
  const json eagle =
      c.eagle_config_json.empty() ? json::object() : json::parse(c.eagle_config_json);
  if (eagle.is_object() && eagle.contains("use_aux_hidden_state") &&
      eagle.at("use_aux_hidden_state") == false) {
    bad_key(c.source, "eagle_config.use_aux_hidden_state",
            "is false (a draft without the target's captured layers), which fsdp-train does not "
            "train",
            "remove the key (EAGLE3 reads the captured target layers)");
  }
}

void check_rope_scaling(const DraftConfig& c) {
  if (c.rope_scaling.type == RopeType::kLlama3 &&
      c.rope_scaling.original_max_position_embeddings <= 0) {
    bad_key(c.source, "rope_scaling.original_max_position_embeddings",
            "must be positive for llama3", "copy rope_scaling from the target model's config.json");
  }
}

}  // namespace

void DraftConfig::validate() const {
  check_architecture_and_sizes(*this);
  check_layers(*this);
  check_attention_shape(*this);
  check_vocab_and_target_width(*this);
  check_scalars(*this);
  check_untrained_keys(*this);
  check_rope_scaling(*this);
  check_fits_in_memory(*this, host_memory_bytes());
}

std::string DraftConfig::to_json() const {
  ordered_json j;
  j["architectures"] = json::array({architectures.at(0)});
  // vLLM's EAGLE config reads the file through AutoConfig, which picks the class by model_type.
  if (qk_norm) j["model_type"] = "qwen3";
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  if (head_dim) j["head_dim"] = *head_dim;
  j["num_hidden_layers"] = num_hidden_layers;
  j["vocab_size"] = vocab_size;
  j["draft_vocab_size"] = draft_vocab();
  j["rms_norm_eps"] = rms_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] =
      rope_scaling_json.empty() ? ordered_json() : ordered_json::parse(rope_scaling_json);
  j["hidden_act"] = hidden_act;
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  if (target_hidden_size) j["target_hidden_size"] = *target_hidden_size;
  // vLLM sizes fc from this key (else from the id list, else 3): written whenever n is not 3.
  if (num_aux_hidden_states_given || num_aux_hidden_states != 3)
    j["num_aux_hidden_states"] = num_aux_hidden_states;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = torch_dtype;
  for (auto [key, value] : {std::pair<const char*, bool>{"fc_norm", fc_norm},
                            {"norm_before_fc", norm_before_fc},
                            {"norm_output", norm_output},
                            {"norm_before_residual", norm_before_residual}}) {
    const bool given = std::find(variant_keys_given.begin(), variant_keys_given.end(), key) !=
                       variant_keys_given.end();
    if (value || given) j[key] = value;
  }
  if (!eagle_config_json.empty()) j["eagle_config"] = ordered_json::parse(eagle_config_json);
  for (const auto& [k, v] : extra_json)
    if (!(qk_norm && k == "model_type")) j[k] = ordered_json::parse(v);
  return j.dump(2) + "\n";
}

ParamCounts count_parameters(const DraftConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  ParamCounts p;
  const int64_t qkv = c.q_out_features() + 2 * c.kv_out_features();
  // Every layer: q/k/v/o (and q_norm, k_norm for Qwen3 layers), input_layernorm,
  // post_attention_layernorm, the MLP; the first one
  // reads [embedding, hidden] (2H) and has hidden_norm, the others read H.
  const int64_t layer_rest =
      H * c.q_out_features() + 2 * H + 3 * H * I + (c.qk_norm ? 2 * c.head_dim_value() : 0);
  p.trainable = H * c.fc_in_features()                                        // fc
                + ((c.fc_norm || c.norm_before_fc) ? c.fc_in_features() : 0)  // fc's norms
                + qkv * 2 * H + H + layer_rest                                // first layer
                + (c.num_hidden_layers - 1) * (qkv * H + layer_rest)          // the others
                + H                                                           // norm
                + c.draft_vocab() * H;                                        // lm_head
  p.frozen_embedding = c.vocab_size * H;
  p.buffers = c.draft_vocab() + c.vocab_size;
  return p;
}

}  // namespace fsdp::model
