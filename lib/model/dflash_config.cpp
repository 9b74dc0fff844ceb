// Parsing of the DFlash / DSpark block-draft config (model/dflash_config.h). Torch-free.
#include "model/dflash_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace fsdp::model {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& source, const std::string& key, const std::string& what,
                      const std::string& hint) {
  throw_usage_error(__FILE__, __LINE__,
                    str("block draft config ", source, ": key '", key, "' ", what), hint);
}

bool present(const json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

int64_t whole(const json& v, const std::string& source, const std::string& key) {
  if (v.is_number_integer()) return v.get<int64_t>();
  bad(source, key, str("must be an integer, got ", v.dump()), "write a whole number");
}

// The Llama/Qwen3 core keys, read by the EAGLE3 draft-config parser so their checks are shared.
// Qwen3's defaults where the block draft may leave a key out: head_dim 128,
// max_position_embeddings 32768.
DraftConfig parse_core(const json& j, const std::string& source) {
  static const char* kCore[] = {"hidden_size",
                                "intermediate_size",
                                "num_attention_heads",
                                "num_key_value_heads",
                                "head_dim",
                                "num_hidden_layers",
                                "vocab_size",
                                "rms_norm_eps",
                                "rope_theta",
                                "rope_scaling",
                                "max_position_embeddings",
                                "rope_parameters",
                                "hidden_act",
                                "initializer_range"};
  json core = json::object();
  core["architectures"] = json::array({"LlamaForCausalLMEagle3"});  // the shared parser's own
  for (const char* k : kCore)
    if (j.contains(k)) core[k] = j.at(k);
  // Qwen3Config's num_key_value_heads default is 32, not the head count the shared parser would
  // take: a config must say it.
  if (!present(core, "num_key_value_heads"))
    bad(source, "num_key_value_heads", "is missing",
        "write the draft's key/value head count (Qwen3Config would take 32, whatever the heads)");
  if (!present(core, "head_dim")) core["head_dim"] = 128;
  if (!present(core, "max_position_embeddings")) core["max_position_embeddings"] = 32768;
  return parse_draft_config(core.dump(), source);
}

std::vector<BlockAttention> parse_layer_types(const json& j, const DFlashConfig& c,
                                              bool sliding_enabled, int64_t max_window_layers) {
  const int64_t L = c.num_layers();
  std::vector<BlockAttention> out;
  if (!present(j, "layer_types")) {
    // Qwen3Config's rule: layers from max_window_layers on slide when sliding is enabled.
    for (int64_t i = 0; i < L; ++i)
      out.push_back(sliding_enabled && i >= max_window_layers ? BlockAttention::kSliding
                                                              : BlockAttention::kFull);
    return out;
  }
  const json& lt = j.at("layer_types");
  if (!lt.is_array() || static_cast<int64_t>(lt.size()) != L)
    bad(c.source, "layer_types", str("must list one entry per layer (num_hidden_layers ", L, ")"),
        "write one of \"full_attention\" / \"sliding_attention\" per draft layer");
  for (const auto& v : lt) {
    const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
    if (s == "full_attention")
      out.push_back(BlockAttention::kFull);
    else if (s == "sliding_attention")
      out.push_back(BlockAttention::kSliding);
    else
      bad(c.source, "layer_types", str("has '", s, "'"),
          "block drafts support full_attention and sliding_attention only");
  }
  return out;
}

void parse_sliding(const json& j, DFlashConfig& c) {
  const bool enabled = present(j, "use_sliding_window") &&
                       j.at("use_sliding_window").is_boolean() &&
                       j.at("use_sliding_window").get<bool>();
  const int64_t max_window_layers =
      present(j, "max_window_layers")
          ? whole(j.at("max_window_layers"), c.source, "max_window_layers")
          : 28;
  std::optional<int64_t> window;
  // Qwen3Config keeps sliding_window only with use_sliding_window (default 4096).
  if (enabled)
    window = present(j, "sliding_window")
                 ? whole(j.at("sliding_window"), c.source, "sliding_window")
                 : 4096;
  c.layer_types = parse_layer_types(j, c, enabled && window.has_value(), max_window_layers);
  bool slides = false;
  for (auto t : c.layer_types) slides = slides || t == BlockAttention::kSliding;
  if (!slides) return;
  if (!window || *window <= 0)
    bad(c.source, "sliding_window",
        "must be positive with use_sliding_window true when a layer is sliding_attention",
        "set use_sliding_window: true and sliding_window, or make every layer full_attention");
  c.sliding_window = window;
}

void parse_block_keys(const json& j, DFlashConfig& c) {
  if (!present(j, "block_size"))
    bad(c.source, "block_size", "is missing", "add the draft's block size (16 for z-lab's drafts)");
  c.block_size = whole(j.at("block_size"), c.source, "block_size");
  if (c.block_size < 2)
    bad(c.source, "block_size", str("must be at least 2, got ", c.block_size),
        "a block is the anchor token and at least one prediction");
  if (present(j, "num_target_layers")) {
    c.num_target_layers = whole(j.at("num_target_layers"), c.source, "num_target_layers");
    if (*c.num_target_layers < 4)
      bad(c.source, "num_target_layers", str("must be at least 4, got ", *c.num_target_layers),
          "write the target model's num_hidden_layers");
  }
  const json dc = present(j, "dflash_config") ? j.at("dflash_config") : json::object();
  if (!dc.is_object())
    bad(c.source, "dflash_config", "must be an object", "see docs/block-drafts.md");
  if (present(dc, "target_layer_ids")) {
    const json& ids = dc.at("target_layer_ids");
    if (!ids.is_array() || ids.empty())
      bad(c.source, "dflash_config.target_layer_ids", "must be a non-empty list of layer ids",
          "list the 0-based target layers whose outputs the draft reads");
    for (const auto& v : ids) {
      const int64_t id = whole(v, c.source, "dflash_config.target_layer_ids");
      if (id < 0 || (c.num_target_layers && id >= *c.num_target_layers))
        bad(c.source, "dflash_config.target_layer_ids",
            str("has layer ", id, " outside the target's ",
                c.num_target_layers ? *c.num_target_layers : 0, " layers"),
            "use 0-based ids below num_target_layers");
      c.target_layer_ids.push_back(id);
    }
  } else if (c.num_target_layers) {
    c.target_layer_ids = default_target_layer_ids(*c.num_target_layers, c.num_layers());
  } else {
    bad(c.source, "dflash_config.target_layer_ids",
        "is missing and so is num_target_layers (SpecForge's default needs it)",
        "add dflash_config.target_layer_ids or num_target_layers");
  }
  if (present(dc, "mask_token_id")) {
    c.mask_token_id = whole(dc.at("mask_token_id"), c.source, "dflash_config.mask_token_id");
    if (*c.mask_token_id < 0 || *c.mask_token_id >= c.core.vocab_size)
      bad(c.source, "dflash_config.mask_token_id",
          str(*c.mask_token_id, " is outside the vocabulary (vocab_size ", c.core.vocab_size, ")"),
          "use the id of a token of the target's vocabulary (the target tokenizer's mask or a "
          "reserved token)");
  }
}

}  // namespace

int64_t DFlashConfig::require_mask_token() const {
  if (!mask_token_id)
    bad(source, "dflash_config.mask_token_id", "is missing",
        "set the token that fills a block's unknown positions (a reserved token of the target's "
        "vocabulary)");
  return *mask_token_id;
}

std::vector<int64_t> default_target_layer_ids(int64_t num_target_layers, int64_t num_draft_layers) {
  if (num_draft_layers == 1) return {num_target_layers / 2};
  const double start = 1, span = static_cast<double>(num_target_layers - 3) - start;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < num_draft_layers; ++i) {
    // Python's round(): halves to even, as std::nearbyint in the default rounding mode.
    ids.push_back(static_cast<int64_t>(std::nearbyint(
        start + static_cast<double>(i) * span / static_cast<double>(num_draft_layers - 1))));
  }
  return ids;
}

DFlashConfig parse_dflash_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    FSDP_USAGE_FAIL(str("block draft config ", source, " is not valid JSON: ", e.what()),
                    "fix the file (a config.json of a DFlash or DSpark draft)");
  }
  if (!j.is_object())
    FSDP_USAGE_FAIL(str("block draft config ", source, " is not a JSON object"),
                    "give a config.json of a DFlash or DSpark draft");
  DFlashConfig c;
  c.source = source;
  c.json_text = json_text;
  static const std::set<std::string> kKnown = {"DFlashDraftModel", "DSparkDraftModel"};
  if (present(j, "architectures") && j.at("architectures").is_array())
    for (const auto& a : j.at("architectures"))
      if (a.is_string() && kKnown.count(a.get<std::string>()))
        c.architecture = a.get<std::string>();
  if (c.architecture.empty())
    bad(source, "architectures", "names neither DFlashDraftModel nor DSparkDraftModel",
        "give a block draft's config.json");
  c.core = parse_core(j, source);
  if (present(j, "attention_bias")) {
    if (!j.at("attention_bias").is_boolean())
      bad(source, "attention_bias", "must be true or false", "write a JSON boolean");
    c.attention_bias = j.at("attention_bias").get<bool>();
  }
  if (c.core.hidden_act != "silu")
    bad(source, "hidden_act", str("is '", c.core.hidden_act, "'"),
        "block drafts are Qwen3 layers with silu");
  if (present(j, "tie_word_embeddings") && j.at("tie_word_embeddings").is_boolean() &&
      j.at("tie_word_embeddings").get<bool>())
    bad(source, "tie_word_embeddings", "is true",
        "a block draft has no embedding or LM head of its own (it uses the target's): set false");
  parse_block_keys(j, c);
  parse_sliding(j, c);
  return c;
}

DFlashConfig load_dflash_config(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    FSDP_USAGE_FAIL(str("cannot read the block draft config ", path),
                    "check --draft-model-config names an existing config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_dflash_config(ss.str(), path);
}

}  // namespace fsdp::model
