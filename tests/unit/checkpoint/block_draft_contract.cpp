// The block drafts' serving contract (checkpoint/block_draft_contract.h): the export config.json
// from a SpecForge-style draft config (every key the engines read, where each reads it), the
// layout against a hand-written list and against SpecForge 0.2.0's own DFlashDraftModel /
// DSparkDraftModel state dicts built from the exported config, and each refused input naming its
// key.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/block_draft_contract.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using namespace fsdp::checkpoint;
using json = nlohmann::json;

namespace {

// SpecForge's generated DFlash config for a tiny target (populate_dflash_generated_config's keys)
// with H 16, 4 heads of 4, 2 kv heads, V 40, 2 layers.
json dflash_draft() {
  return {{"architectures", {"DFlashDraftModel"}},
          {"model_type", "qwen3"},
          {"hidden_size", 16},
          {"intermediate_size", 24},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 4},
          {"vocab_size", 40},
          {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 256},
          {"rope_theta", 500000.0},
          {"block_size", 4},
          {"num_target_layers", 12},
          {"layer_types", {"full_attention", "full_attention"}},
          {"sliding_window", nullptr},
          {"use_sliding_window", false},
          {"dflash_config", {{"target_layer_ids", {1, 5, 9}}}},
          {"custom_key", "kept"}};
}

json dspark_draft() {
  json d = dflash_draft();
  d["architectures"] = {"DSparkDraftModel"};
  d["dflash_config"]["markov_rank"] = 6;
  d["dflash_config"]["confidence_head_alpha"] = 0.5;  // SpecForge: the confidence head is built
  d["dflash_config"]["confidence_head_with_markov"] = true;
  return d;
}

BlockDraftTraining training() {
  BlockDraftTraining t;
  t.source = "draft.json";
  t.target_layer_ids = {1, 5, 9};
  t.mask_token_id = 39;
  t.target_num_layers = 12;
  t.target_vocab_size = 40;
  t.target_hidden_size = 16;
  t.torch_dtype = "float32";
  return t;
}

// The UsageError's message of exporting `draft`, "" when it exports.
std::string refusal(const json& draft, const BlockDraftTraining& t = training()) {
  try {
    block_draft_export_config(draft, t);
  } catch (const fsdp::UsageError& e) {
    return e.message();
  }
  return "";
}

std::string names_shapes(const std::vector<BlockDraftTensor>& layout) {
  json j = json::object();
  for (const auto& x : layout) j[x.name] = x.shape;
  return j.dump();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("fsdp_bdc_" + name + "_" + std::to_string(::getpid()));
  fsdp::remove_tree(p.string());
  fs::create_directories(p);
  return p;
}

}  // namespace

TEST_CASE("block draft export config: a DFlash draft", "[cpu]") {
  const json c = block_draft_export_config(dflash_draft(), training());
  INFO(c.dump(1));
  CHECK(c["architectures"] == json({"DFlashDraftModel"}));
  CHECK(c["model_type"] == "qwen3");
  CHECK(c["dflash_config"]["target_layer_ids"] == json({1, 5, 9}));
  CHECK(c["dflash_config"]["mask_token_id"] == 39);
  CHECK(c["num_target_layers"] == 12);
  CHECK(c["block_size"] == 4);
  CHECK(c["num_key_value_heads"] == 2);
  CHECK(c["head_dim"] == 4);
  json no_head_dim = dflash_draft();
  no_head_dim.erase("head_dim");  // Qwen3Config's default, written for every engine
  CHECK(block_draft_export_config(no_head_dim, training())["head_dim"] == 128);
  CHECK(c["rope_theta"] == 500000.0);
  CHECK(c["rope_parameters"] == json({{"rope_type", "default"}, {"rope_theta", 500000.0}}));
  CHECK(c["rope_scaling"].is_null());
  CHECK(c["layer_types"] == json({"full_attention", "full_attention"}));
  CHECK(c["torch_dtype"] == "float32");
  CHECK(c["tie_word_embeddings"] == false);
  CHECK(c["custom_key"] == "kept");
  CHECK(!c.contains("markov_rank"));
  CHECK(block_draft_kind(c) == BlockDraftKind::kDFlash);
  CHECK(engine_draft_tokens(BlockDraftKind::kDFlash, 4) == 3);
}

TEST_CASE("block draft export config: DSpark's heads where each engine reads them", "[cpu]") {
  const json c = block_draft_export_config(dspark_draft(), training());
  INFO(c.dump(1));
  CHECK(c["architectures"] == json({"DSparkDraftModel"}));
  for (const json* o : {&c, &c["dflash_config"]}) {
    CHECK((*o)["markov_rank"] == 6);
    CHECK((*o)["markov_head_type"] == "vanilla");
    CHECK((*o)["enable_confidence_head"] == true);  // from confidence_head_alpha > 0
    CHECK((*o)["confidence_head_with_markov"] == true);
  }
  CHECK(c["dflash_config"]["projector_type"] == "dspark");
  CHECK(c["sample_from_anchor"] == true);
  CHECK(engine_draft_tokens(BlockDraftKind::kDSpark, 4) == 4);
  CHECK(block_draft_engines(c).vllm);
  json gated = dspark_draft();
  gated["markov_head_type"] = "Gated";  // read at the top level too, lower-cased
  const json g = block_draft_export_config(gated, training());
  CHECK(g["dflash_config"]["markov_head_type"] == "gated");
  CHECK(!block_draft_engines(g).vllm);
  CHECK(block_draft_engines(g).sglang);
}

TEST_CASE("block draft export config: DSpark without a Markov head is vLLM's only", "[cpu]") {
  json d = dspark_draft();
  d["dflash_config"]["markov_rank"] = 0;
  d["dflash_config"]["confidence_head_with_markov"] = false;
  const json c = block_draft_export_config(d, training());
  CHECK(c["markov_rank"] == 0);
  CHECK(block_draft_engines(c).vllm);
  CHECK(!block_draft_engines(c).sglang);
  for (const auto& x : block_draft_layout(c)) CHECK(x.name.rfind("markov_head.", 0) != 0);
  CHECK(block_draft_layout(c).back().shape == std::vector<int64_t>{1});  // the confidence bias
}

TEST_CASE("block draft export config: RoPE scaling and sliding layers", "[cpu]") {
  json d = dflash_draft();
  d.erase("rope_theta");
  d["rope_parameters"] = {{"rope_type", "yarn"},
                          {"factor", 4.0},
                          {"rope_theta", 1e6},
                          {"original_max_position_embeddings", 64}};
  d["layer_types"] = {"sliding_attention", "full_attention"};
  d["sliding_window"] = 32;
  const json c = block_draft_export_config(d, training());
  CHECK(c["rope_theta"] == 1e6);
  CHECK(c["rope_scaling"] ==
        json({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}}));
  CHECK(c["rope_parameters"]["rope_theta"] == 1e6);
  CHECK(c["use_sliding_window"] == true);
  CHECK(c["sliding_window"] == 32);
  // No base anywhere: transformers' Qwen3Config default, written out.
  json bare = dflash_draft();
  bare.erase("rope_theta");
  CHECK(block_draft_export_config(bare, training())["rope_theta"] == 10000.0);
}

TEST_CASE("block draft export config: refused inputs name their key", "[cpu]") {
  auto with = [](const std::string& key, const json& value) {
    json d = dflash_draft();
    d[key] = value;
    return d;
  };
  CHECK_THAT(refusal(with("architectures", {"LlamaForCausalLMEagle3"})),
             Catch::Contains("architectures"));
  CHECK_THAT(refusal(with("vocab_size", 41)), Catch::Contains("vocab_size 41"));
  CHECK_THAT(refusal(with("hidden_size", 32)), Catch::Contains("hidden_size 32"));
  CHECK_THAT(refusal(with("draft_vocab_size", 20)), Catch::Contains("draft_vocab_size"));
  CHECK_THAT(refusal(with("target_hidden_size", 20)), Catch::Contains("target_hidden_size"));
  CHECK_THAT(refusal(with("block_size", 1)), Catch::Contains("block_size"));
  CHECK_THAT(refusal(with("intermediate_size", "24")), Catch::Contains("intermediate_size"));
  CHECK_THAT(refusal(with("num_key_value_heads", 3)), Catch::Contains("num_key_value_heads"));
  json no_kv = dflash_draft();
  no_kv.erase("num_key_value_heads");
  CHECK_THAT(refusal(no_kv), Catch::Contains("num_key_value_heads"));
  json implicit_sliding = dflash_draft();
  implicit_sliding.erase("layer_types");
  implicit_sliding["use_sliding_window"] = true;
  CHECK_THAT(refusal(implicit_sliding), Catch::Contains("layer_types"));
  CHECK_THAT(refusal(with("layer_types", {"full_attention"})), Catch::Contains("layer_types"));
  CHECK_THAT(refusal(with("layer_types", {"full_attention", "linear_attention"})),
             Catch::Contains("layer_types"));
  CHECK_THAT(refusal(with("layer_types", {"sliding_attention", "full_attention"})),
             Catch::Contains("sliding_window"));
  CHECK_THAT(refusal(with("dflash_config", {{"target_layer_ids", {1, 5}}})),
             Catch::Contains("target_layer_ids"));
  BlockDraftTraining t = training();
  t.target_layer_ids = {1, 5, 12};
  CHECK_THAT(refusal(with("dflash_config", json::object()), t), Catch::Contains("12"));
  t = training();
  t.mask_token_id = 40;
  CHECK_THAT(refusal(dflash_draft(), t), Catch::Contains("mask_token_id 40"));
  json s = dspark_draft();
  s["dflash_config"].erase("markov_rank");  // no Markov head: the confidence head cannot read it
  CHECK_THAT(refusal(s), Catch::Contains("confidence_head_with_markov"));
  s = dspark_draft();
  s["dflash_config"]["markov_head_type"] = "lstm";
  CHECK_THAT(refusal(s), Catch::Contains("lstm"));
  s = dspark_draft();
  s["markov_rank"] = 8;  // the top level says otherwise than dflash_config, which SpecForge reads
  CHECK_THAT(refusal(s), Catch::Contains("markov_rank"));
  s["markov_rank"] = 6;
  CHECK(refusal(s).empty());
  s = dspark_draft();
  s["dflash_config"]["projector_type"] = "domino";
  CHECK_THAT(refusal(s), Catch::Contains("projector_type"));
  CHECK(refusal(dflash_draft()).empty());
}

TEST_CASE("block draft layout: every tensor with its shape", "[cpu]") {
  json c = block_draft_export_config(dspark_draft(), training());
  c["num_hidden_layers"] = 1;
  c["layer_types"] = {"full_attention"};
  const json want = {{"fc.weight", {16, 48}},
                     {"hidden_norm.weight", {16}},
                     {"layers.0.self_attn.q_proj.weight", {16, 16}},
                     {"layers.0.self_attn.k_proj.weight", {8, 16}},
                     {"layers.0.self_attn.v_proj.weight", {8, 16}},
                     {"layers.0.self_attn.o_proj.weight", {16, 16}},
                     {"layers.0.self_attn.q_norm.weight", {4}},
                     {"layers.0.self_attn.k_norm.weight", {4}},
                     {"layers.0.mlp.gate_proj.weight", {24, 16}},
                     {"layers.0.mlp.up_proj.weight", {24, 16}},
                     {"layers.0.mlp.down_proj.weight", {16, 24}},
                     {"layers.0.input_layernorm.weight", {16}},
                     {"layers.0.post_attention_layernorm.weight", {16}},
                     {"norm.weight", {16}},
                     {"markov_head.markov_w1.weight", {40, 6}},
                     {"markov_head.markov_w2.weight", {40, 6}},
                     {"confidence_head.proj.weight", {1, 22}},
                     {"confidence_head.proj.bias", {1}}};
  CHECK(names_shapes(block_draft_layout(c)) == want.dump());
  c.erase("num_attention_heads");
  CHECK_THROWS_AS(block_draft_layout(c), fsdp::UsageError);
}

// SpecForge's own modules, built from the config.json the export writes, hold exactly the tensors
// of block_draft_layout: the names the engines read are the names SpecForge trains.
TEST_CASE("block draft layout equals SpecForge 0.2.0's state dicts", "[cpu][python]") {
  if (!fs::exists(FSDP_PYTHON))
    FAIL("no Python at FSDP_PYTHON '" << FSDP_PYTHON << "' (launch/setup.sh configures its venv)");
  const fs::path dir = fresh_dir("specforge");
  std::vector<std::pair<std::string, json>> cases;
  json bias = dflash_draft();
  bias["attention_bias"] = true;
  cases.push_back({"dflash_bias", block_draft_export_config(bias, training())});
  cases.push_back({"dspark_vanilla", block_draft_export_config(dspark_draft(), training())});
  for (const char* type : {"gated", "rnn"}) {
    json d = dspark_draft();
    d["dflash_config"]["markov_head_type"] = type;
    d["dflash_config"]["confidence_head_alpha"] = 0.0;
    cases.push_back({std::string("dspark_") + type, block_draft_export_config(d, training())});
  }
  json names = json::array();
  for (const auto& c : cases) names.push_back(c.first);
  std::ostringstream script;
  script << "import json, os, sys\nos.environ['TORCHDYNAMO_DISABLE'] = '1'\n"
         << "from transformers import Qwen3Config\n"
         << "from specforge.modeling.draft.dflash import DFlashDraftModel\n"
         << "from specforge.modeling.draft.dspark import DSparkDraftModel\n"
         << "out = {}\n"
         << "for name in " << names.dump() << ":\n"
         << "  cfg = Qwen3Config(**json.load(open(os.path.join(sys.argv[1], name + '.json'))))\n"
         << "  cls = DSparkDraftModel if cfg.architectures[0] == 'DSparkDraftModel' else "
            "DFlashDraftModel\n"
         << "  out[name] = {k: list(v.shape) for k, v in cls(cfg).state_dict().items()}\n"
         << "json.dump(out, open(os.path.join(sys.argv[1], 'out.json'), 'w'))\n";
  std::ofstream(dir / "layout.py") << script.str();
  for (const auto& [name, cfg] : cases) std::ofstream(dir / (name + ".json")) << cfg.dump();
  const std::string cmd = std::string(FSDP_PYTHON) + " " + (dir / "layout.py").string() + " " +
                          dir.string() + " > " + (dir / "log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "log");
  INFO(std::string(std::istreambuf_iterator<char>(log), {}));
  REQUIRE(rc == 0);
  const json got = json::parse(std::ifstream(dir / "out.json"));
  for (const auto& [name, cfg] : cases) {
    INFO(name);
    CHECK(got.at(name).dump() == json::parse(names_shapes(block_draft_layout(cfg))).dump());
  }
  fsdp::remove_tree(dir.string());
}
