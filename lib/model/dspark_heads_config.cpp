// Parsing of the DSpark keys of a draft config (dspark_heads_config.h). Torch-free, so it compiles
// in seconds; never accepts a value SpecForge's DSparkDraftModel would read otherwise.
#include "model/dspark_heads_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace fsdp::model {
namespace {

using nlohmann::json;

[[noreturn]] void bad_key(const std::string& source, const std::string& key,
                          const std::string& what, const std::string& hint) {
  throw_usage_error(__FILE__, __LINE__, str("draft config ", source, ": key '", key, "' ", what),
                    hint);
}

// One DSpark key as found: its value (null when absent) and the spelling it was found under.
struct Found {
  json value;
  std::string name;
  bool present = false;
};

// dflash_config's spelling wins (SpecForge reads only that one); the top level is read when
// dflash_config lacks the key; both present with different values is an error.
Found find_key(const json& top, const json& method, const std::string& key,
               const std::string& source) {
  const bool in_method = method.is_object() && method.contains(key);
  const bool in_top = top.contains(key);
  if (in_method && in_top && method.at(key) != top.at(key)) {
    bad_key(
        source, "dflash_config." + key,
        str("is ", method.at(key).dump(), " but the top-level '", key, "' is ", top.at(key).dump()),
        "give both spellings the same value (SpecForge reads dflash_config, vLLM the top "
        "level), or remove one");
  }
  if (in_method) return {method.at(key), "dflash_config." + key, true};
  if (in_top) return {top.at(key), key, true};
  return {json(), key, false};
}

int64_t whole_number(const json& v, const std::string& name, const std::string& source) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  bad_key(source, name, str("must be an integer, got ", v.dump()),
          str("write a whole number, e.g. \"", name, "\": 16"));
}

bool boolean(const Found& f, const std::string& source) {
  if (!f.value.is_boolean()) {
    bad_key(source, f.name, str("must be true or false, got ", f.value.dump()),
            "write true or false (without quotes)");
  }
  return f.value.get<bool>();
}

std::string lower_string(const Found& f, const std::string& source, const std::string& choices) {
  if (!f.value.is_string()) {
    bad_key(source, f.name, str("must be a string, got ", f.value.dump()),
            "write one of " + choices + " in quotes");
  }
  std::string s = f.value.get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

int64_t positive_top(const json& top, const std::string& key, const std::string& source) {
  if (!top.contains(key) || top.at(key).is_null()) {
    bad_key(source, key, "is missing", "add it to the draft config (the target model's value)");
  }
  const int64_t v = whole_number(top.at(key), key, source);
  if (v <= 0) bad_key(source, key, str("must be positive, got ", v), "use the target's value");
  return v;
}

MarkovHeadType parse_markov_type(const Found& f, const std::string& source) {
  if (!f.present) return MarkovHeadType::kVanilla;
  const std::string t = lower_string(f, source, "vanilla, gated, rnn");
  if (t == "vanilla") return MarkovHeadType::kVanilla;
  if (t == "gated") return MarkovHeadType::kGated;
  if (t == "rnn") return MarkovHeadType::kRnn;
  bad_key(source, f.name, str("'", t, "' is not a Markov head type"),
          "use vanilla, gated or rnn (or markov_rank 0 for no Markov head)");
}

void parse_markov(DSparkHeadsConfig& c, const json& top, const json& method) {
  const Found rank = find_key(top, method, "markov_rank", c.source);
  if (rank.present && !rank.value.is_null()) {
    if (rank.value.is_boolean()) {
      bad_key(c.source, rank.name, "must be an integer, got a boolean", "write e.g. 16");
    }
    c.markov_rank = whole_number(rank.value, rank.name, c.source);
    if (c.markov_rank < 0) {
      bad_key(c.source, rank.name, str("must be >= 0, got ", c.markov_rank),
              "use 0 for no Markov head or the rank of the low-rank bias, e.g. 16");
    }
  }
  // SpecForge reads the type only when there is a head to build.
  if (c.markov_rank > 0) {
    c.markov_head_type =
        parse_markov_type(find_key(top, method, "markov_head_type", c.source), c.source);
  }
}

void parse_confidence(DSparkHeadsConfig& c, const json& top, const json& method) {
  const Found alpha = find_key(top, method, "confidence_head_alpha", c.source);
  if (alpha.present && !alpha.value.is_null()) {
    if (!alpha.value.is_number() || !std::isfinite(alpha.value.get<double>())) {
      bad_key(c.source, alpha.name, str("must be a number, got ", alpha.value.dump()),
              "write a number, e.g. 1.0");
    }
    c.confidence_head_alpha = alpha.value.get<double>();
  }
  const Found enable = find_key(top, method, "enable_confidence_head", c.source);
  c.enable_confidence_head =
      enable.present ? boolean(enable, c.source) : c.confidence_head_alpha > 0.0;
  const Found with_markov = find_key(top, method, "confidence_head_with_markov", c.source);
  if (with_markov.present) c.confidence_head_with_markov = boolean(with_markov, c.source);
}

void parse_attention_mode(DSparkHeadsConfig& c, const json& top, const json& method) {
  const Found mode = find_key(top, method, "attention_mode", c.source);
  if (mode.present) c.attention_mode = lower_string(mode, c.source, "gqa, mha");
  if (c.attention_mode != "gqa" && c.attention_mode != "mha") {
    bad_key(c.source, mode.name, str("'", c.attention_mode, "' is not an attention mode"),
            "use gqa (fewer key/value heads than query heads) or mha (equal counts)");
  }
  const int64_t heads = positive_top(top, "num_attention_heads", c.source);
  const bool kv_given =
      top.contains("num_key_value_heads") && !top["num_key_value_heads"].is_null();
  const int64_t kv = kv_given ? positive_top(top, "num_key_value_heads", c.source) : heads;
  if (heads % kv != 0) {
    bad_key(c.source, "num_key_value_heads",
            str("(", kv, ") must divide num_attention_heads (", heads, ")"),
            "use a divisor of num_attention_heads");
  }
  if (c.attention_mode == "gqa" && kv >= heads) {
    bad_key(c.source, "num_key_value_heads",
            str("(", kv, ") must be below num_attention_heads (", heads,
                ") for DSpark's default "
                "attention_mode gqa"),
            "use fewer key/value heads, or set dflash_config.attention_mode to \"mha\"");
  }
  if (c.attention_mode == "mha" && kv != heads) {
    bad_key(c.source, "num_key_value_heads",
            str("(", kv, ") must equal num_attention_heads (", heads, ") with attention_mode mha"),
            "use equal head counts, or attention_mode \"gqa\"");
  }
}

}  // namespace

std::string markov_head_type_name(MarkovHeadType t) {
  switch (t) {
    case MarkovHeadType::kVanilla:
      return "vanilla";
    case MarkovHeadType::kGated:
      return "gated";
    case MarkovHeadType::kRnn:
      return "rnn";
  }
  return "?";
}

void DSparkHeadsConfig::validate() const {
  if (vocab_size <= 0) bad_key(source, "vocab_size", "must be positive", "use the target's value");
  if (hidden_size <= 0) {
    bad_key(source, "hidden_size", "must be positive", "use the target's hidden size");
  }
  if (markov_rank < 0) bad_key(source, "markov_rank", "must be >= 0", "use 0 for no Markov head");
  if (confidence_head_with_markov && markov_rank == 0) {
    bad_key(source, "confidence_head_with_markov", "is true but markov_rank is 0",
            "set markov_rank > 0, or confidence_head_with_markov false");
  }
  if (!(initializer_range > 0) || !std::isfinite(initializer_range)) {
    bad_key(source, "initializer_range", str("must be a positive number, got ", initializer_range),
            "use 0.02");
  }
}

std::string DSparkHeadsConfig::keys_json() const {
  json j = json::object();
  j["markov_rank"] = markov_rank;
  j["markov_head_type"] = markov_head_type_name(markov_head_type);
  j["enable_confidence_head"] = enable_confidence_head;
  j["confidence_head_with_markov"] = confidence_head_with_markov;
  return j.dump();
}

std::string dspark_state_dict_name(const std::string& key) {
  const std::string legacy = "logit_head.";
  if (key.rfind(legacy, 0) != 0) return key;
  const std::string rest = key.substr(legacy.size());
  for (const char* head : {"markov_head.", "confidence_head.", "prefix_gru.", "embed_proj."})
    if (rest.rfind(head, 0) == 0) return rest;
  return key;
}

DSparkHeadsConfig parse_dspark_heads_config(const std::string& json_text,
                                            const std::string& source) {
  json top;
  try {
    top = json::parse(json_text);
  } catch (const json::parse_error& e) {
    FSDP_USAGE_FAIL(str("draft config ", source, " is not valid JSON: ", e.what()),
                    "fix the JSON syntax (a config.json as SpecForge writes it)");
  }
  if (!top.is_object()) {
    FSDP_USAGE_FAIL(str("draft config ", source, " is not a JSON object"),
                    "give the draft model's config.json");
  }
  DSparkHeadsConfig c;
  c.source = source;
  json method;
  if (top.contains("dflash_config") && !top["dflash_config"].is_null()) {
    method = top["dflash_config"];
    if (!method.is_object()) {
      bad_key(source, "dflash_config", str("must be an object, got ", method.dump()),
              "write dflash_config as {\"markov_rank\": 16, ...}");
    }
    if (method.contains("projector_type") && !method["projector_type"].is_null() &&
        method["projector_type"] != json("dspark")) {
      bad_key(source, "dflash_config.projector_type",
              str("is ", method["projector_type"].dump(), "; a DSpark draft requires \"dspark\""),
              "set it to \"dspark\" or remove it");
    }
  }
  c.vocab_size = positive_top(top, "vocab_size", source);
  c.hidden_size = positive_top(top, "hidden_size", source);
  if (top.contains("initializer_range") && !top["initializer_range"].is_null()) {
    const json& r = top["initializer_range"];
    if (!r.is_number()) {
      bad_key(source, "initializer_range", str("must be a number, got ", r.dump()), "use 0.02");
    }
    // HF's _init_weights: `initializer_range or 0.02`.
    if (r.get<double>() != 0.0) c.initializer_range = r.get<double>();
  }
  parse_markov(c, top, method);
  parse_confidence(c, top, method);
  parse_attention_mode(c, top, method);
  c.validate();
  return c;
}

DSparkHeadsConfig load_dspark_heads_config(const std::string& path) {
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), str("cannot open draft config ", path),
                   "check --draft-model-config points at the draft's config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_dspark_heads_config(ss.str(), path);
}

}  // namespace fsdp::model
