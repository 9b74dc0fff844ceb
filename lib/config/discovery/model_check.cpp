// Start-up check that the draft config, the target model directory and the run's sizes agree
// (discover.h check_model_files), so a mismatch fails before any tensor is read with a
// message naming the flag. Reads only the two small JSON files; never opens safetensors.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>

#include "config/discovery/discover.h"
#include "core/error.h"

namespace fsdp::config {

namespace {

nlohmann::json read_json(const std::string& path, const char* flag) {
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), str(flag, ": cannot read '", path, "'"), "check the path");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    FSDP_USAGE_FAIL(str(flag, ": '", path, "' is not valid JSON (", e.what(), ")"),
                    "fix or replace the file");
  }
  return {};
}

std::optional<int64_t> get_int(const nlohmann::json& j, const char* key) {
  if (j.is_object() && j.contains(key) && j[key].is_number_integer()) return j[key].get<int64_t>();
  return std::nullopt;
}

}  // namespace

void check_model_files(const TrainConfig& cfg) {
  const std::string draft_path = cfg.model.draft_model_config;
  const auto draft = read_json(draft_path, "--draft-model-config");
  FSDP_USAGE_CHECK(draft.is_object(),
                   str("--draft-model-config '", draft_path, "' is not a JSON object"),
                   "give the draft model's config.json");
  const auto draft_vocab = get_int(draft, "vocab_size");
  const auto draft_hidden = get_int(draft, "hidden_size");
  FSDP_USAGE_CHECK(
      draft_vocab && draft_hidden,
      str("--draft-model-config '", draft_path, "' lacks integer vocab_size and hidden_size"),
      "use a LlamaForCausalLMEagle3 config such as configs/models/llama3-8B-eagle3.json");
  if (const auto dv = get_int(draft, "draft_vocab_size")) {
    FSDP_USAGE_CHECK(*dv > 0 && *dv <= *draft_vocab,
                     str("--draft-model-config '", draft_path, "': draft_vocab_size ", *dv,
                         " is not in 1..vocab_size ", *draft_vocab),
                     "the draft vocabulary is a subset of the target's");
  }

  const std::string target_cfg = cfg.model.target_model_path + "/config.json";
  std::ifstream probe(target_cfg);
  FSDP_USAGE_CHECK(
      probe.good(),
      str("--target-model-path '", cfg.model.target_model_path, "' has no config.json"),
      "point it at a Hugging Face model directory (config.json + *.safetensors)");
  auto target = read_json(target_cfg, "--target-model-path");
  // Multimodal checkpoints keep the language model's sizes under text_config.
  if (target.is_object() && target.contains("text_config") && !target.contains("hidden_size"))
    target = target["text_config"];
  const auto target_vocab = get_int(target, "vocab_size");
  const auto target_hidden = get_int(target, "hidden_size");
  if (target_vocab) {
    FSDP_USAGE_CHECK(
        *target_vocab == *draft_vocab,
        str("--draft-model-config vocab_size ", *draft_vocab,
            " differs from the target's vocab_size ", *target_vocab, " (", target_cfg, ")"),
        "the draft shares the target's tokenizer: use the draft config made for "
        "this target, or fix --target-model-path");
  }
  if (target_hidden) {
    const auto expected = get_int(draft, "target_hidden_size").value_or(*draft_hidden);
    FSDP_USAGE_CHECK(expected == *target_hidden,
                     str("--draft-model-config expects target hidden size ", expected,
                         " (target_hidden_size, else hidden_size) but the target has ",
                         *target_hidden, " (", target_cfg, ")"),
                     "use the draft config made for this target, or set target_hidden_size");
  }
}

}  // namespace fsdp::config
