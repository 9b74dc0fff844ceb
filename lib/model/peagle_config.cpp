// The P-EAGLE draft config (model/peagle_config.h).
#include "model/peagle_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace fsdp::model {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& source, const std::string& key, const std::string& what,
                      const std::string& hint) {
  throw_usage_error(__FILE__, __LINE__, str("draft config ", source, ": key '", key, "' ", what),
                    hint);
}

bool flag_set(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_boolean() && j.at(key).get<bool>();
}

}  // namespace

PEagleConfig parse_peagle_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw_usage_error(__FILE__, __LINE__,
                      str("draft config ", source, " is not valid JSON: ", e.what()),
                      "fix the syntax (python -m json.tool shows where)");
  }
  FSDP_USAGE_CHECK(j.is_object(), str("draft config ", source, " must be a JSON object"),
                   "the file should look like an HF config.json");
  if (j.value("architectures", json()) != json::array({kPEagleArchitecture}))
    bad(source, "architectures",
        str("must be [\"", kPEagleArchitecture, "\"], got ",
            j.value("architectures", json()).dump()),
        "use a SpecForge P-EAGLE draft config");
  // SpecForge's PEagleDraftModel builds none of these EAGLE3 variants (vLLM would, from the same
  // file, and serve another model than the one trained).
  for (const char* key : {"fc_norm", "norm_before_fc", "norm_output"})
    if (flag_set(j, key))
      bad(source, key, "is true, an EAGLE3 variant P-EAGLE drafts do not have",
          str("write \"", key, "\": false or remove it"));
  if (j.contains("model_type") && j.at("model_type") != json("llama"))
    bad(source, "model_type",
        str("is ", j.at("model_type").dump(), "; P-EAGLE drafts are Llama layers"),
        "write \"model_type\": \"llama\"");
  PEagleConfig c;
  c.source = source;
  json core = j;
  core["architectures"] = json::array({kEagle3LlamaArchitecture});
  core.erase("mask_token_id");
  c.core = parse_draft_config(core.dump(), source);
  std::optional<int64_t> nested;
  if (j.contains("dflash_config") && j.at("dflash_config").is_object() &&
      j.at("dflash_config").contains("mask_token_id") &&
      !j.at("dflash_config").at("mask_token_id").is_null()) {
    const json& v = j.at("dflash_config").at("mask_token_id");
    if (!v.is_number_integer())
      bad(source, "dflash_config.mask_token_id", str("must be an integer, got ", v.dump()),
          "write the mask token's id");
    nested = v.get<int64_t>();
  }
  if (j.contains("mask_token_id") && !j.at("mask_token_id").is_null()) {
    const json& v = j.at("mask_token_id");
    if (!v.is_number_integer())
      bad(source, "mask_token_id", str("must be an integer, got ", v.dump()),
          "write the mask token's id");
    c.mask_token_id = v.get<int64_t>();
    if (nested && *nested != *c.mask_token_id)
      bad(source, "mask_token_id",
          str("is ", *c.mask_token_id, " but dflash_config.mask_token_id is ", *nested),
          "give one mask token");
  } else {
    c.mask_token_id = nested;
  }
  if (c.mask_token_id && (*c.mask_token_id < 0 || *c.mask_token_id >= c.core.vocab_size))
    bad(source, "mask_token_id",
        str("is ", *c.mask_token_id, ", outside the vocabulary [0, ", c.core.vocab_size, ")"),
        "use a token id of the target's vocabulary");
  return c;
}

PEagleConfig load_peagle_config(const std::string& path) {
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), str("cannot open draft config ", path), "check --draft-model-config");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_peagle_config(ss.str(), path);
}

std::string PEagleConfig::to_json() const {
  ordered_json j = ordered_json::parse(core.to_json());
  j["architectures"] = ordered_json::array({kPEagleArchitecture});
  if (!j.contains("model_type")) j["model_type"] = "llama";
  if (mask_token_id) j["mask_token_id"] = *mask_token_id;
  return j.dump(2) + "\n";
}

}  // namespace fsdp::model
