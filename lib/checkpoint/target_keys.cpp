// Resolution of the target's embedding and LM head names (target_keys.h).
#include "checkpoint/target_keys.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace fsdp::checkpoint {
namespace {

using json = nlohmann::json;

// The last two dot-separated components of a name ("lm_head.weight" of "a.b.lm_head.weight").
std::string tail_of(const std::string& name) {
  const size_t last = name.rfind('.');
  if (last == std::string::npos || last == 0) return name;
  const size_t prev = name.rfind('.', last - 1);
  return prev == std::string::npos ? name : name.substr(prev + 1);
}

std::vector<std::string> with_tail(const std::map<std::string, std::string>& weights,
                                   const std::string& tail) {
  std::vector<std::string> out;
  for (const auto& [name, file] : weights)
    if (name == tail ||
        (name.size() > tail.size() &&
         name.compare(name.size() - tail.size() - 1, std::string::npos, "." + tail) == 0))
      out.push_back(name);
  return out;
}

std::string quoted(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

// config.json's tie_word_embeddings (top level, else text_config); nullopt when neither says.
std::optional<bool> tied(const std::string& model_dir) {
  std::ifstream in(model_dir + "/config.json");
  if (!in) return std::nullopt;
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  for (const json* c :
       {&j, j.is_object() && j.contains("text_config") ? &j["text_config"] : nullptr}) {
    if (c && c->is_object() && c->contains("tie_word_embeddings") &&
        (*c)["tie_word_embeddings"].is_boolean())
      return (*c)["tie_word_embeddings"].get<bool>();
  }
  return std::nullopt;
}

}  // namespace

TargetKeys resolve_target_keys(const std::string& model_dir, const TargetKeyRequest& request) {
  const auto weights = model_weight_map(model_dir);
  TargetKeys out{request.embedding_key, request.lm_head_key, ""};
  const auto add_note = [&](const std::string& s) {
    out.note += (out.note.empty() ? "" : "; ") + s;
  };
  const auto missing = [&](const std::string& name, const std::string& flag,
                           const std::vector<std::string>& candidates) {
    FSDP_USAGE_FAIL(str(model_dir, ": no tensor named '", name, "' in the checkpoint"),
                    candidates.empty() ? str("set ", flag, " to a tensor name of the checkpoint")
                                       : str("set ", flag, " to one of ", quoted(candidates)));
  };

  if (!weights.count(out.embedding_key)) {
    const auto c = with_tail(weights, tail_of(out.embedding_key));
    if (!request.embedding_is_default || c.size() != 1)
      missing(out.embedding_key, "--embedding-key", c);
    add_note(str("token embedding '", c[0], "' (no '", out.embedding_key, "')"));
    out.embedding_key = c[0];
  }
  if (weights.count(out.lm_head_key)) return out;
  const auto c = with_tail(weights, tail_of(out.lm_head_key));
  if (request.lm_head_is_default && c.size() == 1) {
    add_note(str("LM head '", c[0], "' (no '", out.lm_head_key, "')"));
    out.lm_head_key = c[0];
    return out;
  }
  if (!request.lm_head_is_default || !c.empty()) missing(out.lm_head_key, "--lm-head-key", c);
  const std::optional<bool> tie = tied(model_dir);
  FSDP_USAGE_CHECK(
      tie.value_or(false),
      str(model_dir, ": no tensor named '", out.lm_head_key,
          "' in the checkpoint, and its config.json ",
          tie ? "says tie_word_embeddings: false" : "does not say tie_word_embeddings: true"),
      str("for a target whose LM head is its embedding pass --lm-head-key ", out.embedding_key,
          "; otherwise set --lm-head-key to the LM head's name"));
  add_note(str("LM head tied to the embedding '", out.embedding_key,
               "' (config.json: tie_word_embeddings true; no '", out.lm_head_key, "')"));
  out.lm_head_key = out.embedding_key;
  return out;
}

FinalNormSpec resolve_final_norm(const std::string& model_dir) {
  const auto weights = model_weight_map(model_dir);
  std::vector<std::string> c;
  for (const auto& [name, file] : weights) {
    const std::string tail = "norm.weight";
    const bool final_norm = name.size() >= tail.size() &&
                            name.compare(name.size() - tail.size(), tail.size(), tail) == 0 &&
                            (name == tail || name[name.size() - tail.size() - 1] == '.') &&
                            name.find("layers.") == std::string::npos &&
                            name.find("vision") == std::string::npos &&
                            name.find("visual") == std::string::npos;
    if (final_norm) c.push_back(name);
  }
  FSDP_USAGE_CHECK(c.size() == 1,
                   c.empty() ? str(model_dir,
                                   ": no final norm tensor (*.norm.weight outside the "
                                   "decoder layers) in the checkpoint")
                             : str(model_dir, ": several final norm candidates ", quoted(c)),
                   "features stored before the final norm (speculators) need the target's final "
                   "RMSNorm: point --target-model-path at the full target checkpoint");
  std::ifstream in(model_dir + "/config.json");
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  for (const json* cfg :
       {&j, j.is_object() && j.contains("text_config") ? &j["text_config"] : nullptr}) {
    if (cfg && cfg->is_object() && cfg->contains("rms_norm_eps") &&
        (*cfg)["rms_norm_eps"].is_number())
      return {c[0], (*cfg)["rms_norm_eps"].get<double>()};
  }
  FSDP_USAGE_FAIL(str(model_dir, "/config.json: no rms_norm_eps"),
                  "the final norm of features stored before it (speculators) needs the "
                  "target's rms_norm_eps; check --target-model-path");
}

}  // namespace fsdp::checkpoint
