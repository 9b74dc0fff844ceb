// The draft config made from a target's config.json when --draft-model-config is absent (as
// SpecForge's generate_draft_model_config does): copied keys, the template's own values,
// multimodal text_config, small vocabularies, and the file written into the cache.
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/discovery/draft_auto.h"
#include "config/discovery/hf_cache.h"
#include "config_test_util.h"
#include "core/fs_util.h"
#include "support/test_paths.h"

using namespace fsdp::config;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
json made(const json& target) {
  return json::parse(draft_config_from_target(target.dump(), "t"));
}

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("fsdp_da_" + name + "_" + std::to_string(::getpid()));
  fsdp::remove_tree(p.string());
  fs::create_directories(p);
  return p;
}
}  // namespace

TEST_CASE("the embedded template is configs/models/llama3-8B-eagle3.json", "[config]") {
  std::ifstream in(std::string(FSDP_SOURCE_DIR) + "/configs/models/llama3-8B-eagle3.json");
  REQUIRE(in.good());
  CHECK(json::parse(in) == json::parse(draft_config_template()));
}

TEST_CASE("a draft config from a Llama 3.1 target copies its sizes into the template", "[config]") {
  const json llama = {{"architectures", {"LlamaForCausalLM"}},
                      {"hidden_size", 4096},
                      {"intermediate_size", 14336},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},
                      {"num_hidden_layers", 32},
                      {"vocab_size", 128256},
                      {"max_position_embeddings", 131072},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 500000.0},
                      {"bos_token_id", 128000},
                      {"eos_token_id", {128001, 128008, 128009}},
                      {"torch_dtype", "bfloat16"},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false}};
  const json d = made(llama);
  CHECK(d["architectures"] == json{"LlamaForCausalLMEagle3"});
  CHECK(d["num_hidden_layers"] == 1);
  CHECK(d["max_position_embeddings"] == 131072);
  CHECK(d["eos_token_id"] == json{128001, 128008, 128009});
  CHECK(d["torch_dtype"] == "bfloat16");
  CHECK(d["draft_vocab_size"] == 32000);
  // Not copied, as in SpecForge: the template's (absent) rope_theta and rope_scaling.
  CHECK_FALSE(d.contains("rope_theta"));
  CHECK(d["use_cache"] == true);

  // Qwen3-4B-like: 2560 hidden, no num_key_value_heads key (multi-head: the heads), dtype key,
  // tied embeddings (the draft's own lm_head is never tied).
  const json qwen = {{"hidden_size", 2560},       {"intermediate_size", 9728},
                     {"num_attention_heads", 32}, {"vocab_size", 151936},
                     {"dtype", "bfloat16"},       {"tie_word_embeddings", true},
                     {"rms_norm_eps", 1e-6},      {"hidden_act", "silu"}};
  const json q = made(qwen);
  CHECK(q["hidden_size"] == 2560);
  CHECK(q["num_key_value_heads"] == 32);
  json qnull = qwen;
  qnull["num_key_value_heads"] = nullptr;  // Hugging Face reads null as "the attention heads"
  CHECK(made(qnull)["num_key_value_heads"] == 32);
  CHECK(q["torch_dtype"] == "bfloat16");
  CHECK(q["tie_word_embeddings"] == false);
  CHECK(q["rms_norm_eps"] == 1e-6);
  CHECK(q["bos_token_id"] == 128000);  // the template's, as SpecForge leaves it

  // Multimodal: the language model's sizes under text_config.
  const json mm = {{"architectures", {"Llama4ForConditionalGeneration"}},
                   {"text_config",
                    {{"hidden_size", 5120},
                     {"vocab_size", 202048},
                     {"num_attention_heads", 40},
                     {"num_key_value_heads", 8},
                     {"intermediate_size", 8192}}},
                   {"vision_config", {{"hidden_size", 1408}}}};
  CHECK(made(mm)["hidden_size"] == 5120);
  CHECK(made(mm)["vocab_size"] == 202048);

  // gpt-oss-120b: hidden / heads = 2880 / 64 = 45 is odd (no rotary embedding): the target's
  // head_dim. Where hidden / heads works, head_dim stays unset as in SpecForge (Qwen3-4B: 80).
  const json oss = {{"hidden_size", 2880},      {"num_attention_heads", 64},
                    {"num_key_value_heads", 8}, {"head_dim", 64},
                    {"vocab_size", 201088},     {"intermediate_size", 2880}};
  CHECK(made(oss)["head_dim"] == 64);
  json qwen4 = qwen;
  qwen4["head_dim"] = 128;
  CHECK_FALSE(made(qwen4).contains("head_dim"));

  // A vocabulary smaller than 32000: the draft vocabulary is all of it.
  CHECK(made({{"hidden_size", 64}, {"vocab_size", 512}})["draft_vocab_size"] == 512);
  require_usage_error([] { made({{"model_type", "x"}}); }, "no hidden_size and vocab_size");
  require_usage_error([] { draft_config_from_target("[1]", "t.json"); },
                      "t.json: not a JSON object");
}

TEST_CASE("no --draft-model-config: the made config is written into the cache", "[config]") {
  const fs::path dir = temp_dir("target");
  const fs::path target = dir / "My-Target-7B";
  fs::create_directories(target);
  std::ofstream(target / "config.json") << R"({"hidden_size": 64, "vocab_size": 512,
      "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 128})";
  const std::string cache = (dir / "cache").string();
  const TrainConfig c =
      resolve_args({"--target-model-path", target.string(), "--cache-dir", cache});
  const std::string path = c.model.draft_model_config;
  CHECK(path.rfind(cache + "/draft_configs/my-target-7b-eagle3-auto-", 0) == 0);
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  CHECK(json::parse(text.str())["hidden_size"] == 64);
  // Same target, same file (the name is the content's hash); a given config is left alone.
  CHECK(resolve_args({"--target-model-path", target.string(), "--cache-dir", cache})
            .model.draft_model_config == path);
  CHECK(resolve_args({"--target-model-path", target.string(), "--cache-dir", cache,
                      "--draft-model-config", "/my/draft.json"})
            .model.draft_model_config == "/my/draft.json");
  // --init-checkpoint brings its own config.json.
  const fs::path init = dir / "init";
  fs::create_directories(init);
  std::ofstream(init / "config.json") << "{}";
  CHECK(resolve_args({"--target-model-path", target.string(), "--cache-dir", cache,
                      "--init-checkpoint", init.string()})
            .model.draft_model_config == (init / "config.json").string());
  // --resume brings the checkpoint's own: PATH's, or for auto the newest complete one's.
  const fs::path out = dir / "out";
  for (const char* name :
       {"epoch_0_step_2", "epoch_1_step_10", "epoch_1_step_9", "epoch_2_step_1"}) {
    fs::create_directories(out / name);
    std::ofstream(out / name / "config.json") << "{}";
    if (std::string(name) != "epoch_2_step_1") std::ofstream(out / name / "COMPLETE") << "";
  }
  CHECK(resolve_args({"--target-model-path", target.string(), "--cache-dir", cache, "--resume",
                      (out / "epoch_0_step_2").string()})
            .model.draft_model_config == (out / "epoch_0_step_2" / "config.json").string());
  CHECK(resolve_args({"--target-model-path", target.string(), "--cache-dir", cache, "--resume",
                      "auto", "--output-dir", out.string()})
            .model.draft_model_config == (out / "epoch_1_step_10" / "config.json").string());
  // A fresh --resume auto (no checkpoint yet) makes one from the target.
  CHECK(resolve_args({"--target-model-path", target.string(), "--cache-dir", cache, "--resume",
                      "auto", "--output-dir", (dir / "fresh").string()})
            .model.draft_model_config == path);

  // No config.json in the target: nothing is made, and validation asks for a draft config.
  TrainConfig none = resolve_args({"--target-model-path", dir.string(), "--cache-dir", cache,
                                   "--output-dir", (dir / "out").string()});
  CHECK(none.model.draft_model_config.empty());
  require_usage_error(
      [&] {
        validate(none, 1, ValidateOptions{false, false});
      },
      "none can be made without the target's config.json");
  fsdp::remove_tree(dir.string());
}

TEST_CASE("a repository id as --target-model-path is found in the Hugging Face cache", "[config]") {
  CHECK(looks_like_repo_id("meta-llama/Llama-3.1-8B-Instruct"));
  CHECK(looks_like_repo_id("Qwen/Qwen3-8B"));
  for (const char* path : {"/models/x", "./a/b", "a/b/c", "models", "a/", "../x", "a b/c"})
    CHECK_FALSE(looks_like_repo_id(path));

  const fs::path dir = temp_dir("hub");
  const fs::path repo = dir / "hub" / "models--Qwen--Qwen3-8B";
  fs::create_directories(repo / "snapshots" / "abc123");
  fs::create_directories(repo / "snapshots" / "old999");
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "abc123";
  std::ofstream(repo / "snapshots" / "abc123" / "config.json")
      << R"({"hidden_size": 64, "vocab_size": 512, "num_attention_heads": 2,
            "intermediate_size": 128})";
  const std::vector<std::string> caches{(dir / "empty").string(), (dir / "hub").string()};
  CHECK(find_hub_snapshot("Qwen/Qwen3-8B", caches) == (repo / "snapshots" / "abc123").string());
  CHECK_FALSE(find_hub_snapshot("Qwen/Qwen3-4B", caches).has_value());
  // refs/main naming a missing snapshot, and two snapshots without refs/main: errors.
  std::ofstream(repo / "refs" / "main") << "gone";
  require_usage_error([&] { find_hub_snapshot("Qwen/Qwen3-8B", caches); }, "interrupted download");
  fs::remove(repo / "refs" / "main");
  require_usage_error([&] { find_hub_snapshot("Qwen/Qwen3-8B", caches); }, "2 snapshots");
  fsdp::remove_tree((repo / "snapshots" / "old999").string());
  CHECK(find_hub_snapshot("Qwen/Qwen3-8B", caches) == (repo / "snapshots" / "abc123").string());

  // Through resolve(): SpecForge's --model-download-dir is searched first, the draft config
  // made from the snapshot is named after the repository.
  const std::string cache = (dir / "cache").string();
  const TrainConfig c =
      resolve_args({"--target-model-path", "Qwen/Qwen3-8B", "--model-download-dir",
                    (dir / "hub").string(), "--cache-dir", cache});
  CHECK(c.model.target_model_path == (repo / "snapshots" / "abc123").string());
  std::vector<std::string> report;
  ResolveOptions ro;
  ro.report = &report;
  resolve_args({"--target-model-path", "Qwen/Qwen3-8B", "--model-download-dir",
                (dir / "hub").string(), "--cache-dir", cache},
               ro);
  REQUIRE(report.size() == 2);
  CHECK(report[0].rfind("--target-model-path Qwen/Qwen3-8B: the Hugging Face cache's snapshot",
                        0) == 0);
  CHECK(c.model.draft_model_config.rfind(cache + "/draft_configs/qwen3-8b-eagle3-auto-", 0) == 0);
  // Not cached: resolve() leaves it, validation says how to download it.
  TrainConfig missing = resolve_args({"--target-model-path", "Qwen/Qwen3-4B", "--cache-dir", cache,
                                      "--model-download-dir", (dir / "hub").string()});
  CHECK(missing.model.target_model_path == "Qwen/Qwen3-4B");
  missing.model.draft_model_config = (dir / "d.json").string();
  require_usage_error(
      [&] {
        validate(missing, 1, ValidateOptions{true, false});
      },
      "huggingface-cli download Qwen/Qwen3-4B");
  fsdp::remove_tree(dir.string());
}

TEST_CASE("specforge train's draft config copies the target's own fields", "[config]") {
  const json qwen = {{"architectures", {"Qwen3ForCausalLM"}},
                     {"hidden_size", 4096},
                     {"intermediate_size", 12288},
                     {"num_attention_heads", 32},
                     {"num_key_value_heads", 8},
                     {"head_dim", 128},
                     {"max_position_embeddings", 40960},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 1000000},
                     {"rope_scaling", nullptr},
                     {"initializer_range", 0.02},
                     {"attention_bias", false},
                     {"hidden_act", "silu"},
                     {"vocab_size", 151936},
                     {"bos_token_id", 151643},
                     {"eos_token_id", 151645},
                     {"sliding_window", nullptr},
                     {"use_sliding_window", false},
                     {"torch_dtype", "bfloat16"},
                     {"num_hidden_layers", 36}};
  const json d = json::parse(draft_config_from_target_fields(qwen.dump(), "t"));
  CHECK(d["architectures"] == json::array({"LlamaForCausalLMEagle3"}));
  CHECK(d["model_type"] == "llama");
  CHECK(d["rope_theta"] == 1000000);  // the template would leave 10000
  CHECK(d["head_dim"] == 128);
  CHECK(d["num_key_value_heads"] == 8);
  CHECK(d["max_position_embeddings"] == 40960);
  CHECK(d["num_hidden_layers"] == 1);
  CHECK(d["draft_vocab_size"] == 32000);
  CHECK(d["pad_token_id"] == 0);
  CHECK(d["tie_word_embeddings"] == false);
  CHECK(d["use_sliding_window"] == false);
  CHECK_FALSE(d.contains("rope_scaling"));          // null in the target: not copied
  CHECK_FALSE(d.contains("torch_dtype"));           // not an architecture field
  CHECK_FALSE(d.contains("transformers_version"));  // no template underneath
  // The text model of a multimodal config, its padded vocabulary, a small vocabulary.
  const json mm = {
      {"text_config", {{"hidden_size", 64}, {"vocab_size", 500}, {"padded_vocab_size", 512}}},
      {"hidden_size", 1}};
  const json m = json::parse(draft_config_from_target_fields(mm.dump(), "t"));
  CHECK(m["hidden_size"] == 64);
  CHECK(m["vocab_size"] == 512);
  CHECK(m["draft_vocab_size"] == 512);
  require_usage_error([] { draft_config_from_target_fields(R"({"vocab_size": 5})", "t.json"); },
                      "t.json");
}
