// check-export on block drafts (DFlash, DSpark; checkpoint/export_check.h): a good synthetic
// export of each kind passes, and each kind of bad one (a missing, misshapen, mistyped or extra
// tensor; a config key an engine reads otherwise or not at all; ids outside the target; a mask
// token outside the vocabulary) is an ERROR (or WARN) naming the tensor or key, matched by that
// subject and one word, never by sentences.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/block_draft_contract.h"
#include "checkpoint/export.h"
#include "checkpoint/export_check.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs_util.h"

namespace fs = std::filesystem;
using namespace fsdp::checkpoint;
using json = nlohmann::json;
using Level = ExportFinding::Level;
using fsdp::model::ExportTarget;

namespace {

// A 2-layer draft of H 16 (4 heads of 4, 2 kv heads), V 40, over a 12-layer target.
constexpr int64_t kTargetLayers = 12, kVocab = 40, kHidden = 16;

json draft_config(BlockDraftKind kind) {
  json d = {{"architectures", {block_draft_architecture(kind)}},
            {"hidden_size", kHidden},
            {"intermediate_size", 24},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 4},
            {"vocab_size", kVocab},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},
            {"block_size", 4},
            {"dflash_config", {{"target_layer_ids", {1, 5, 9}}}}};
  if (kind == BlockDraftKind::kDSpark) {
    d["dflash_config"]["markov_rank"] = 6;
    d["dflash_config"]["enable_confidence_head"] = true;
    d["dflash_config"]["confidence_head_with_markov"] = true;
  }
  return d;
}

struct Export {
  json config;
  NamedTensors tensors;
  void erase(const std::string& name) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [&](const auto& p) { return p.first == name; }),
                  tensors.end());
  }
  void set(const std::string& name, const at::Tensor& t) {
    erase(name);
    tensors.emplace_back(name, t);
  }
};

// The export fsdp-train writes: config from the contract, every tensor of its layout (the layout
// itself is checked against SpecForge's modules in block_draft_contract.cpp).
Export good(const json& draft) {
  BlockDraftTraining t;
  t.source = "draft.json";
  t.target_layer_ids = {1, 5, 9};
  t.mask_token_id = 7;
  t.target_num_layers = kTargetLayers;
  t.target_vocab_size = kVocab;
  t.target_hidden_size = kHidden;
  t.torch_dtype = "bfloat16";
  Export e;
  e.config = block_draft_export_config(draft, t);
  for (const auto& x : block_draft_layout(e.config))
    e.tensors.emplace_back(x.name, at::randn(x.shape).to(at::kBFloat16));
  return e;
}

Export good(BlockDraftKind kind) {
  return good(draft_config(kind));
}

struct TempDirs {
  std::vector<fs::path> paths;
  ~TempDirs() {
    for (const auto& p : paths) fsdp::remove_tree(p.string());
  }
};

fs::path write(const std::string& name, const Export& e) {
  static TempDirs dirs;
  const fs::path dir =
      fs::temp_directory_path() / ("fsdp_xcb_" + name + "_" + std::to_string(::getpid()));
  fsdp::remove_tree(dir.string());
  fs::create_directories(dir);
  dirs.paths.push_back(dir);
  std::ofstream(dir / "config.json") << e.config.dump(1);
  write_safetensors((dir / "model.safetensors").string(), e.tensors);
  return dir;
}

std::vector<ExportFinding> check(const fs::path& dir, ExportTarget engines = ExportTarget::kEngines,
                                 bool with_target = true) {
  ExportCheckOptions o;
  o.engines = engines;
  if (with_target) {
    o.target_num_layers = kTargetLayers;
    o.target_vocab_size = kVocab;
    o.target_hidden_size = kHidden;
  }
  return check_export(dir.string(), o);
}

std::vector<ExportFinding> check(const std::string& name, const Export& e,
                                 ExportTarget engines = ExportTarget::kEngines) {
  return check(write(name, e), engines);
}

std::string dump(const std::vector<ExportFinding>& f) {
  std::string s;
  for (const auto& x : f) s += finding_line(x) + "\n";
  return s;
}

bool has(const std::vector<ExportFinding>& f, Level level, const std::string& subject,
         const std::string& word = "") {
  return std::any_of(f.begin(), f.end(), [&](const ExportFinding& x) {
    return x.level == level && x.subject == subject && x.message.find(word) != std::string::npos;
  });
}

int count(const std::vector<ExportFinding>& f, Level level) {
  return static_cast<int>(
      std::count_if(f.begin(), f.end(), [&](const auto& x) { return x.level == level; }));
}

std::string key(const std::string& k) {
  return "config.json:" + k;
}

}  // namespace

TEST_CASE("block export check: good DFlash and DSpark exports pass", "[cpu]") {
  for (const auto kind : {BlockDraftKind::kDFlash, BlockDraftKind::kDSpark}) {
    const auto f = check(block_draft_kind_name(kind), good(kind));
    INFO(dump(f));
    CHECK(count(f, Level::kError) == 0);
    CHECK(has(f, Level::kOk, "fc.weight", "[16, 48]"));
    CHECK(has(f, Level::kOk, key("dflash_config.target_layer_ids"), "[2,6,10]"));
    CHECK(has(
        f, Level::kOk, key("block_size"),
        kind == BlockDraftKind::kDFlash ? "num_speculative_tokens 3" : "num_speculative_tokens 4"));
    CHECK(has(f, Level::kOk, key("dflash_config.mask_token_id"), "7"));
  }
  // The export's own check (engines from the config) passes too.
  CHECK_NOTHROW(verify_export(write("verify", good(BlockDraftKind::kDSpark)).string()));
}

TEST_CASE("block export check: missing, misshapen, mistyped and extra tensors", "[cpu]") {
  Export e = good(BlockDraftKind::kDFlash);
  e.erase("layers.1.self_attn.k_norm.weight");
  auto f = check("missing", e);
  INFO(dump(f));
  CHECK(has(f, Level::kError, "layers.1.self_attn.k_norm.weight", "missing"));

  e = good(BlockDraftKind::kDFlash);
  e.set("fc.weight", at::zeros({kHidden, 2 * kHidden}, at::kBFloat16));
  f = check("fc_shape", e);
  CHECK(has(f, Level::kError, "fc.weight", "expected [16, 48]"));

  e = good(BlockDraftKind::kDFlash);
  e.set("norm.weight", at::zeros({kHidden}, at::kInt));
  f = check("int_weight", e);
  CHECK(has(f, Level::kError, "norm.weight", "I32"));

  e = good(BlockDraftKind::kDFlash);
  e.set("norm.weight", at::zeros({kHidden}, at::kFloat));
  f = check("f32_weight", e);
  CHECK(has(f, Level::kWarn, "norm.weight", "bfloat16"));
  CHECK(count(f, Level::kError) == 0);

  for (const std::string extra : {"lm_head.weight", "embed_tokens.weight", "d2t",
                                  "model.norm.weight", "layers.2.mlp.up_proj.weight"}) {
    e = good(BlockDraftKind::kDFlash);
    e.set(extra, at::zeros({kVocab}, at::kBFloat16));
    f = check("extra", e);
    INFO(extra);
    CHECK(has(f, Level::kError, extra));
  }
}

TEST_CASE("block export check: target layers, mask token, sizes against the target", "[cpu]") {
  Export e = good(BlockDraftKind::kDFlash);
  e.config["dflash_config"]["target_layer_ids"] = {1, 5, 12};
  auto f = check("id_range", e);
  INFO(dump(f));
  CHECK(has(f, Level::kError, key("dflash_config.target_layer_ids"), "12"));

  e = good(BlockDraftKind::kDFlash);
  e.config["dflash_config"]["target_layer_ids"] = {1, 5, 11};
  f = check("last_layer", e);
  CHECK(has(f, Level::kWarn, key("dflash_config.target_layer_ids"), "last layer"));

  e = good(BlockDraftKind::kDFlash);
  e.config["dflash_config"].erase("target_layer_ids");
  f = check("no_ids", e);
  CHECK(has(f, Level::kError, key("dflash_config.target_layer_ids"), "missing"));

  e = good(BlockDraftKind::kDFlash);
  e.config["dflash_config"]["mask_token_id"] = kVocab;
  f = check("mask_range", e);
  CHECK(has(f, Level::kError, key("dflash_config.mask_token_id"), "outside"));
  e.config["dflash_config"].erase("mask_token_id");
  f = check("no_mask", e);
  CHECK(has(f, Level::kError, key("dflash_config.mask_token_id"), "missing"));

  e = good(BlockDraftKind::kDFlash);
  ExportCheckOptions o;
  o.target_num_layers = kTargetLayers;
  o.target_vocab_size = kVocab + 1;
  o.target_hidden_size = kHidden * 2;
  f = check_export(write("target_sizes", e).string(), o);
  CHECK(has(f, Level::kError, key("vocab_size"), "41"));
  CHECK(has(f, Level::kError, key("hidden_size"), "32"));
  o.target_num_layers = kTargetLayers + 2;
  f = check_export(write("target_layers", e).string(), o);
  CHECK(has(f, Level::kError, key("num_target_layers"), "14"));

  e = good(BlockDraftKind::kDFlash);
  e.config.erase("num_target_layers");
  f = check(write("no_num_target", e), ExportTarget::kEngines, /*with_target=*/false);
  CHECK(has(f, Level::kError, key("num_target_layers"), "SGLang"));
  f = check(write("no_num_target_vllm", e), ExportTarget::kVllm, false);
  CHECK(has(f, Level::kWarn, key("num_target_layers")));
  CHECK(count(f, Level::kError) == 0);

  e = good(BlockDraftKind::kDFlash);
  e.config["eagle_aux_hidden_state_layer_ids"] = {1, 5, 9};
  f = check("aux_ids", e);
  CHECK(has(f, Level::kError, key("eagle_aux_hidden_state_layer_ids"), "[2,6,10]"));
  e.config["eagle_aux_hidden_state_layer_ids"] = {2, 6, 10};
  f = check("aux_ids_ok", e);
  CHECK(count(f, Level::kError) == 0);

  for (const char* k : {"draft_vocab_size", "target_hidden_size"}) {
    e = good(BlockDraftKind::kDFlash);
    e.config[k] = 8;
    f = check("reduced", e);
    CHECK(has(f, Level::kError, key(k)));
  }
}

TEST_CASE("block export check: config keys the engines read", "[cpu]") {
  Export e = good(BlockDraftKind::kDFlash);
  e.config.erase("block_size");
  auto f = check("no_block", e);
  INFO(dump(f));
  CHECK(has(f, Level::kError, key("block_size"), "missing"));

  e = good(BlockDraftKind::kDFlash);
  e.config.erase("model_type");
  f = check("no_model_type", e);
  CHECK(has(f, Level::kError, key("model_type"), "absent"));

  e = good(BlockDraftKind::kDFlash);
  for (const char* k : {"rope_theta", "rope_parameters", "rope_scaling"}) e.config.erase(k);
  f = check("no_rope", e);
  CHECK(has(f, Level::kError, key("rope_theta"), "1e6"));

  e = good(BlockDraftKind::kDFlash);
  e.config["layer_types"] = {"full_attention"};
  f = check("layer_types_len", e);
  CHECK(has(f, Level::kError, key("layer_types")));

  e = good(BlockDraftKind::kDFlash);
  e.config["layer_types"] = {"sliding_attention", "full_attention"};
  e.config["sliding_window"] = nullptr;
  f = check("no_window", e);
  CHECK(has(f, Level::kError, key("sliding_window"), "missing"));
  e.config["sliding_window"] = 8;
  f = check("mixed", e);
  CHECK(has(f, Level::kWarn, key("layer_types"), "V1"));
  CHECK(count(f, Level::kError) == 0);

  e = good(BlockDraftKind::kDFlash);
  e.config["dflash_config"]["causal"] = true;
  f = check("causal", e);
  CHECK(has(f, Level::kError, key("dflash_config.causal")));

  e = good(BlockDraftKind::kDFlash);
  const fs::path dir = write("mask_embedding", e);
  std::ofstream(dir / "mask_embedding.pt") << "x";
  f = check(dir);
  CHECK(has(f, Level::kError, "mask_embedding.pt"));
}

TEST_CASE("block export check: DSpark's heads where each engine reads them", "[cpu]") {
  // SpecForge's own layout: the heads' keys only in dflash_config.
  Export e = good(BlockDraftKind::kDSpark);
  for (const char* k :
       {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"})
    e.config.erase(k);
  auto f = check("specforge_layout", e);
  INFO(dump(f));
  CHECK(has(f, Level::kError, key("markov_rank"), "top level"));
  CHECK(has(f, Level::kError, key("markov_head_type"), "SGLang"));
  CHECK(has(f, Level::kError, key("confidence_head_with_markov"), "vLLM"));
  CHECK(has(f, Level::kWarn, key("enable_confidence_head")));

  e = good(BlockDraftKind::kDSpark);
  e.config["markov_rank"] = 7;
  f = check("disagree", e);
  CHECK(has(f, Level::kError, key("markov_rank"), "SpecForge"));

  e = good(BlockDraftKind::kDSpark);
  e.config["model_type"] = "deepseek_v4";
  f = check("model_type", e);
  CHECK(has(f, Level::kError, key("model_type"), "DeepSeek-V4"));
  e.config["architectures"] = {"Qwen3DSparkModel"};
  f = check("qwen3_arch", e);
  CHECK(!has(f, Level::kError, key("model_type")));
  CHECK(!has(f, Level::kWarn, key("architectures")));

  e = good(BlockDraftKind::kDSpark);
  e.erase("confidence_head.proj.weight");
  e.erase("confidence_head.proj.bias");
  f = check("no_confidence", e);
  CHECK(has(f, Level::kError, key("enable_confidence_head"), "no confidence head"));
  CHECK(has(f, Level::kError, "confidence_head.proj.weight", "missing"));

  e = good(BlockDraftKind::kDSpark);
  e.config["speculators_model_type"] = "dspark";
  f = check("speculators", e);
  CHECK(has(f, Level::kError, key("speculators_model_type")));

  // A gated Markov head: SGLang serves it, vLLM 0.32 does not.
  json d = draft_config(BlockDraftKind::kDSpark);
  d["dflash_config"]["markov_head_type"] = "gated";
  e = good(d);
  f = check("gated", e, ExportTarget::kVllm);
  CHECK(has(f, Level::kError, key("markov_head_type"), "vanilla"));
  CHECK(has(f, Level::kOk, "markov_head.gate_proj.weight"));
  f = check("gated_sglang", e, ExportTarget::kSglang);
  CHECK(count(f, Level::kError) == 0);
  CHECK_NOTHROW(verify_export(write("gated_verify", e).string()));
}

TEST_CASE("block export check: DSpark without a Markov head is vLLM's only", "[cpu]") {
  json d = draft_config(BlockDraftKind::kDSpark);
  d["dflash_config"]["markov_rank"] = 0;
  d["dflash_config"]["confidence_head_with_markov"] = false;
  const Export e = good(d);
  auto f = check("rank0_sglang", e, ExportTarget::kSglang);
  INFO(dump(f));
  CHECK(has(f, Level::kError, key("markov_rank"), "SGLang"));
  f = check("rank0_vllm", e, ExportTarget::kVllm);
  CHECK(count(f, Level::kError) == 0);
  CHECK_NOTHROW(verify_export(write("rank0_verify", e).string()));
}

TEST_CASE("block export check: an EAGLE3 config is not read as a block draft", "[cpu]") {
  Export e = good(BlockDraftKind::kDFlash);
  e.config["architectures"] = {"LlamaForCausalLMEagle3"};
  const auto f = check("eagle3", e);
  INFO(dump(f));
  CHECK(has(f, Level::kError, "lm_head.weight", "missing"));  // the EAGLE3 rules apply
  CHECK(!has(f, Level::kOk, key("dflash_config.target_layer_ids")));
}

TEST_CASE("write_block_draft_export writes the layout, leaves the rest out, checks itself",
          "[cpu]") {
  const Export e = good(BlockDraftKind::kDSpark);
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, t] : e.tensors) state[name] = t.to(at::kFloat);
  state["target_embed_tokens.weight"] = at::zeros({kVocab, kHidden});  // the target's, not ours
  const fs::path dir = write("writer", Export{});
  fsdp::remove_tree(dir.string());
  CHECK(write_block_draft_export(dir.string(), e.config, state, at::kBFloat16) > 0);
  const DraftExport back = read_draft_export(dir.string());
  CHECK(back.weights.size() == e.tensors.size());
  CHECK(!back.weights.count("target_embed_tokens.weight"));
  CHECK(back.weights.at("markov_head.markov_w1.weight").scalar_type() == at::kBFloat16);
  CHECK(at::equal(back.weights.at("fc.weight"), state.at("fc.weight").to(at::kBFloat16)));
  CHECK(!back.d2t.defined());
  CHECK(json::parse(std::ifstream(dir / "config.json")) == e.config);

  state.erase("layers.0.mlp.up_proj.weight");
  CHECK_THROWS_WITH(write_block_draft_export(dir.string(), e.config, state),
                    Catch::Contains("layers.0.mlp.up_proj.weight"));
  state["layers.0.mlp.up_proj.weight"] = at::zeros({24, kHidden + 1});
  CHECK_THROWS_WITH(write_block_draft_export(dir.string(), e.config, state),
                    Catch::Contains("layers.0.mlp.up_proj.weight"));
}
