// SpecForge-compatible draft config generation (draft_auto.h).
#include "config/discovery/draft_auto.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint_dir.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/hash.h"

namespace fsdp::config {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// configs/models/llama3-8B-eagle3.json (SpecForge's default template), key for key.
constexpr const char* kTemplate = R"({
  "architectures": ["LlamaForCausalLMEagle3"],
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "num_hidden_layers": 1,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.28.1",
  "use_cache": true,
  "vocab_size": 128256,
  "draft_vocab_size": 32000
}
)";

}  // namespace

const std::string& draft_config_template() {
  static const std::string text = kTemplate;
  return text;
}

std::string draft_config_from_target(const std::string& target_config_text,
                                     const std::string& source) {
  json target = json::parse(target_config_text, nullptr, /*allow_exceptions=*/false);
  FSDP_USAGE_CHECK(target.is_object(), source + ": not a JSON object",
                   "point --target-model-path at a Hugging Face model directory");
  if (!target.contains("hidden_size") && target.contains("text_config") &&
      target["text_config"].is_object())
    target = target["text_config"];
  FSDP_USAGE_CHECK(target.contains("hidden_size") && target.contains("vocab_size"),
                   source + ": has no hidden_size and vocab_size (nor a text_config with them)",
                   "give --draft-model-config, e.g. a copy of configs/models/llama3-8B-eagle3.json "
                   "with the target's sizes");
  json draft = json::parse(kTemplate);
  for (const char* key : {"vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "max_position_embeddings", "rms_norm_eps",
                          "hidden_act", "bos_token_id", "eos_token_id", "torch_dtype"}) {
    if (target.contains(key) && !target[key].is_null()) draft[key] = target[key];
  }
  if ((!target.contains("num_key_value_heads") || target["num_key_value_heads"].is_null()) &&
      target.contains("num_attention_heads"))
    draft["num_key_value_heads"] = target["num_attention_heads"];
  if (!target.contains("torch_dtype") && target.contains("dtype"))
    draft["torch_dtype"] = target["dtype"];
  // SpecForge leaves head_dim to hidden_size / heads; where that cannot work (gpt-oss: 2880 / 64
  // = 45, odd, so no rotary embedding), the target's own head_dim is taken instead.
  if (draft["hidden_size"].is_number_integer() &&
      draft["num_attention_heads"].is_number_integer() && target.contains("head_dim") &&
      target["head_dim"].is_number_integer()) {
    const int64_t hidden = draft["hidden_size"].get<int64_t>();
    const int64_t heads = draft["num_attention_heads"].get<int64_t>();
    if (heads > 0 && (hidden % heads != 0 || (hidden / heads) % 2 != 0))
      draft["head_dim"] = target["head_dim"];
  }
  draft["num_hidden_layers"] = 1;
  draft["tie_word_embeddings"] = false;
  draft["use_cache"] = true;
  if (draft["vocab_size"].is_number_integer() && draft["draft_vocab_size"].is_number_integer() &&
      draft["vocab_size"].get<int64_t>() < draft["draft_vocab_size"].get<int64_t>())
    draft["draft_vocab_size"] = draft["vocab_size"];
  return draft.dump(2) + "\n";
}

std::string draft_config_from_target_fields(const std::string& target_config_text,
                                            const std::string& source) {
  json target = json::parse(target_config_text, nullptr, /*allow_exceptions=*/false);
  FSDP_USAGE_CHECK(target.is_object(), source + ": not a JSON object",
                   "point --target-model-path at a Hugging Face model directory");
  // specforge train reads the text model's config whenever there is one.
  if (target.contains("text_config") && target["text_config"].is_object())
    target = target["text_config"];
  json draft = json::object();
  for (const char* key : {"vocab_size",          "hidden_size",        "num_attention_heads",
                          "num_key_value_heads", "intermediate_size",  "max_position_embeddings",
                          "rms_norm_eps",        "hidden_act",         "initializer_range",
                          "attention_bias",      "attention_dropout",  "head_dim",
                          "rope_theta",          "rope_scaling",       "rope_parameters",
                          "bos_token_id",        "eos_token_id",       "pad_token_id",
                          "sliding_window",      "use_sliding_window", "max_window_layers"}) {
    if (target.contains(key) && !target[key].is_null()) draft[key] = target[key];
  }
  if (target.contains("padded_vocab_size") && target["padded_vocab_size"].is_number_integer())
    draft["vocab_size"] = target["padded_vocab_size"];
  FSDP_USAGE_CHECK(draft.contains("hidden_size") && draft.contains("vocab_size"),
                   source + ": has no hidden_size and vocab_size (nor a text_config with them)",
                   "give --draft-model-config, e.g. a copy of configs/models/llama3-8B-eagle3.json "
                   "with the target's sizes");
  draft["architectures"] = json::array({"LlamaForCausalLMEagle3"});
  draft["model_type"] = "llama";
  draft["num_hidden_layers"] = 1;
  draft["tie_word_embeddings"] = false;
  draft["use_cache"] = true;
  if (!draft.contains("pad_token_id")) draft["pad_token_id"] = 0;
  int64_t draft_vocab = 32000;
  if (draft["vocab_size"].is_number_integer())
    draft_vocab = std::min<int64_t>(draft_vocab, draft["vocab_size"].get<int64_t>());
  draft["draft_vocab_size"] = draft_vocab;
  return draft.dump(2) + "\n";
}

std::string generate_missing_draft_config(TrainConfig* cfg) {
  if (!cfg->model.draft_model_config.empty() || cfg->model.target_model_path.empty()) return "";
  // A checkpoint to continue or start from brings the draft config it was trained with.
  const auto use_own = [&](const std::string& dir, const char* whose) -> std::string {
    const std::string own = dir + "/config.json";
    std::error_code ec;
    if (dir.empty() || !fs::is_regular_file(own, ec)) return "";
    cfg->model.draft_model_config = own;
    return str("no --draft-model-config: using ", own, " (", whose, ")");
  };
  std::string note;
  if (cfg->checkpoint.resume == ResumeMode::kPath) {
    note = use_own(cfg->checkpoint.resume_path, "the --resume checkpoint's own");
  } else if (cfg->checkpoint.resume == ResumeMode::kAuto) {
    const auto latest = checkpoint::find_latest(cfg->checkpoint.output_dir);
    if (latest)
      note = use_own(latest->path, "the newest checkpoint's own, which --resume continues");
  }
  if (note.empty()) note = use_own(cfg->model.init_checkpoint, "the --init-checkpoint's own");
  if (!note.empty()) return note;
  const std::string target_json = cfg->model.target_model_path + "/config.json";
  std::ifstream in(target_json);
  if (!in.good()) return "";  // validate() says that a draft config is needed
  std::stringstream text;
  text << in.rdbuf();
  const bool fields = cfg->model.auto_draft_config == AutoDraftConfig::kTarget;
  const std::string draft = fields ? draft_config_from_target_fields(text.str(), target_json)
                                   : draft_config_from_target(text.str(), target_json);

  fs::path target = fs::path(cfg->model.target_model_path).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  std::string name = target.filename().string();
  // A Hugging Face cache snapshot (models--<org>--<name>/snapshots/<hash>): the repository name.
  const std::string repo = target.parent_path().parent_path().filename().string();
  if (target.parent_path().filename() == "snapshots" && repo.rfind("models--", 0) == 0)
    name = repo.substr(repo.rfind("--") + 2);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(fnv1a(draft)));
  const fs::path dir = fs::path(cfg->data.cache_dir) / "draft_configs";
  const fs::path path = dir / (name + "-eagle3-auto-" + std::string(hash, 8) + ".json");
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Ranks on several nodes may share the cache and a pid: the host name keeps the names apart.
  char host[256] = "host";
  ::gethostname(host, sizeof(host) - 1);
  const std::string tmp = str(path.string(), ".tmp.", host, ".", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << draft;
    out.flush();
    FSDP_USAGE_CHECK(
        out.good() && !ec,
        str("cannot write the generated draft config ", tmp, ec ? " (" + ec.message() + ")" : ""),
        "make --cache-dir writable, or give --draft-model-config");
  }
  fs::rename(tmp, path, ec);
  std::error_code ignored;
  if (ec) fs::remove(tmp, ignored);
  // The name is the content's hash: another rank's file under it is the same file.
  FSDP_USAGE_CHECK(!ec || fs::is_regular_file(path),
                   str("cannot rename ", tmp, " to ", path.string(), ": ", ec.message()),
                   "make --cache-dir writable, or give --draft-model-config");
  cfg->model.draft_model_config = path.string();
  return str("no --draft-model-config: made ", path.string(), " from ", target_json,
             fields ? " (specforge train's: the target's architecture fields, RoPE included)"
                    : " (SpecForge's llama3-8B-eagle3 template with the target's sizes)",
             "; pass it as --draft-model-config to change it");
}

}  // namespace fsdp::config
