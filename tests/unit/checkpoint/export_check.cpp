// check-export (checkpoint/export_check.h): a good tiny draft passes; one broken directory per
// case, each asserting its own finding by the tensor or key it names (not by whole sentences);
// hostile files (truncated safetensors, corrupt JSON) are findings, never crashes; the export's
// check on itself makes write_draft_export fail.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "checkpoint/export_check.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/serving_contract.h"
#include "core/error.h"
#include "core/fs_util.h"

namespace fs = std::filesystem;
using namespace fsdp::checkpoint;
using json = nlohmann::json;
using Level = ExportFinding::Level;

namespace {

// H 8, I 16, 2 heads of 4, 1 kv head, target_hidden_size 8, 3 aux layers, V 32, Vd 16 (the even
// target ids), a target of 8 layers.
constexpr int64_t H = 8, I = 16, V = 32, Vd = 16, L = 8;

struct Draft {
  json config;
  NamedTensors tensors;
  at::Tensor& operator[](const std::string& name) {
    for (auto& [n, t] : tensors)
      if (n == name) return t;
    FAIL("no tensor " << name);
    throw;
  }
  void erase(const std::string& name) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [&](const auto& p) { return p.first == name; }),
                  tensors.end());
  }
};

Draft good_draft() {
  Draft d;
  d.config = {{"architectures", {"LlamaForCausalLMEagle3"}},
              {"model_type", "llama"},
              {"hidden_size", H},
              {"intermediate_size", I},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 1},
              {"head_dim", 4},
              {"num_hidden_layers", 1},
              {"vocab_size", V},
              {"draft_vocab_size", Vd},
              {"rope_theta", 10000.0},
              {"rope_scaling", nullptr},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"eagle_aux_hidden_state_layer_ids", {2, 4, 7}},
              {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 3, 6}}}}};
  auto w = [](std::vector<int64_t> shape) { return at::randn(shape).to(at::kBFloat16); };
  const std::string a = "midlayer.self_attn.", m = "midlayer.mlp.";
  d.tensors = {{"fc.weight", w({H, 3 * H})},
               {"midlayer.hidden_norm.weight", w({H})},
               {"midlayer.input_layernorm.weight", w({H})},
               {a + "q_proj.weight", w({8, 2 * H})},
               {a + "k_proj.weight", w({4, 2 * H})},
               {a + "v_proj.weight", w({4, 2 * H})},
               {a + "o_proj.weight", w({H, 8})},
               {"midlayer.post_attention_layernorm.weight", w({H})},
               {m + "gate_proj.weight", w({I, H})},
               {m + "up_proj.weight", w({I, H})},
               {m + "down_proj.weight", w({H, I})},
               {"norm.weight", w({H})},
               {"lm_head.weight", w({Vd, H})},
               {"d2t", at::arange(Vd, at::kLong)},  // draft index j -> target id 2j
               {"t2d", at::arange(V, at::kLong).remainder(2).eq(0)}};
  return d;
}

// Every directory a test makes, removed when the process ends.
struct TempDirs {
  std::vector<fs::path> paths;
  ~TempDirs() {
    for (const auto& p : paths) fsdp::remove_tree(p.string());
  }
};

fs::path fresh_dir(const std::string& name) {
  static TempDirs dirs;
  const fs::path p =
      fs::temp_directory_path() / ("fsdp_xc_" + name + "_" + std::to_string(::getpid()));
  fsdp::remove_tree(p.string());
  fs::create_directories(p);
  dirs.paths.push_back(p);
  return p;
}

fs::path write_draft(const std::string& name, const Draft& d) {
  const fs::path dir = fresh_dir(name);
  std::ofstream(dir / "config.json") << d.config.dump(2);
  write_safetensors((dir / "model.safetensors").string(), d.tensors);
  return dir;
}

std::vector<ExportFinding> check(
    const fs::path& dir, int64_t layers = L,
    fsdp::model::ExportTarget engines = fsdp::model::ExportTarget::kEngines) {
  ExportCheckOptions o;
  o.engines = engines;
  o.target_num_layers = layers;
  return check_export(dir.string(), o);
}

std::string dump(const std::vector<ExportFinding>& f) {
  std::string s;
  for (const auto& x : f) s += finding_line(x) + "\n";
  return s;
}

// The first finding at `level` whose subject is `subject` and whose message holds `word`.
bool has(const std::vector<ExportFinding>& f, Level level, const std::string& subject,
         const std::string& word = "") {
  for (const auto& x : f)
    if (x.level == level && x.subject == subject && x.message.find(word) != std::string::npos)
      return true;
  return false;
}

int errors(const std::vector<ExportFinding>& f) {
  return static_cast<int>(
      std::count_if(f.begin(), f.end(), [](const auto& x) { return x.level == Level::kError; }));
}

const std::string kTopIds = "config.json:eagle_aux_hidden_state_layer_ids";
const std::string kNestedIds = "config.json:eagle_config.eagle_aux_hidden_state_layer_ids";

}  // namespace

TEST_CASE("a good draft passes: top-level and eagle_config ids agree", "[cpu]") {
  const auto f = check(write_draft("good", good_draft()));
  INFO(dump(f));
  CHECK(errors(f) == 0);
  CHECK(!has_errors(f));
  CHECK(has(f, Level::kOk, "lm_head.weight"));
  CHECK(has(f, Level::kOk, "embed_tokens.weight", "absent"));
  CHECK(has(f, Level::kOk, "d2t"));
  CHECK(has(f, Level::kOk, "t2d"));
  CHECK(has(f, Level::kOk, kTopIds, "vLLM and SGLang both read hidden_states [2, 4, 7]"));
  CHECK(has(f, Level::kOk, kTopIds, "in range for a 8-layer target"));
  // Without the target the range is not checked, and says so.
  const auto g = check(write_draft("good_nolayers", good_draft()), 0);
  CHECK(errors(g) == 0);
  CHECK(has(g, Level::kOk, kTopIds, "not checked"));
}

TEST_CASE("missing tensors: lm_head, d2t, t2d", "[cpu]") {
  Draft d = good_draft();
  d.erase("lm_head.weight");
  auto f = check(write_draft("no_head", d));
  INFO(dump(f));
  CHECK(has(f, Level::kError, "lm_head.weight", "missing"));

  d = good_draft();
  d.erase("d2t");
  f = check(write_draft("no_d2t", d));
  CHECK(has(f, Level::kError, "d2t", "missing"));

  d = good_draft();
  d.erase("t2d");
  f = check(write_draft("no_t2d", d));
  CHECK(has(f, Level::kError, "t2d", "missing"));
  CHECK(!has(f, Level::kError, "d2t"));

  // Equal vocabularies: no mapping needed.
  d = good_draft();
  d.erase("t2d");
  d.erase("d2t");
  d.config["draft_vocab_size"] = V;
  d["lm_head.weight"] = at::zeros({V, H}, at::kBFloat16);
  f = check(write_draft("same_vocab", d));
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kOk, "d2t", "absent"));
}

TEST_CASE("Qwen3 layers: q_norm/k_norm, model_type qwen3, vLLM only", "[cpu]") {
  auto qwen3 = [] {
    Draft d = good_draft();
    d.config["architectures"] = {"Eagle3Qwen3ForCausalLM"};
    d.config["model_type"] = "qwen3";
    d.tensors.push_back({"midlayer.self_attn.q_norm.weight", at::ones({4}, at::kBFloat16)});
    d.tensors.push_back({"midlayer.self_attn.k_norm.weight", at::ones({4}, at::kBFloat16)});
    return d;
  };
  const auto vllm = fsdp::model::ExportTarget::kVllm;
  auto f = check(write_draft("qwen3", qwen3()), L, vllm);
  INFO(dump(f));
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kOk, "midlayer.self_attn.k_norm.weight"));
  // SGLang's EAGLE3 draft is Llama only.
  CHECK(has(check(write_draft("qwen3_both", qwen3())), Level::kError, "config.json:architectures"));
  Draft d = qwen3();
  d.erase("midlayer.self_attn.q_norm.weight");
  CHECK(has(check(write_draft("qwen3_noq", d), L, vllm), Level::kError,
            "midlayer.self_attn.q_norm.weight", "missing"));
  d = qwen3();
  d.config["model_type"] = "llama";
  CHECK(
      has(check(write_draft("qwen3_llama", d), L, vllm), Level::kError, "config.json:model_type"));
  // Without head_dim the engine builds Qwen3Config's 128: the stored [4] norms are then wrong.
  d = qwen3();
  d.config.erase("head_dim");
  CHECK(has(check(write_draft("qwen3_nohd", d), L, vllm), Level::kError,
            "midlayer.self_attn.q_norm.weight", "shape"));
  // A Llama draft carrying q/k norms: tensors vLLM's llama_eagle3 does not have.
  d = good_draft();
  d.tensors.push_back({"midlayer.self_attn.q_norm.weight", at::ones({4}, at::kBFloat16)});
  CHECK(errors(check(write_draft("llama_qnorm", d), L, vllm)) > 0);
}

TEST_CASE("P-EAGLE: mask_hidden, the mask token, the trained embedding, vLLM only", "[cpu]") {
  auto peagle = [] {
    Draft d = good_draft();
    d.config["mask_token_id"] = V - 1;
    d.tensors.push_back({"mask_hidden", at::randn({1, 1, 3 * H}).to(at::kBFloat16)});
    d.tensors.push_back({"embed_tokens.weight", at::randn({V, H}).to(at::kBFloat16)});
    return d;
  };
  const auto vllm = fsdp::model::ExportTarget::kVllm;
  auto f = check(write_draft("peagle", peagle()), L, vllm);
  INFO(dump(f));
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kOk, "mask_hidden", "parallel_drafting"));
  CHECK(has(f, Level::kOk, "embed_tokens.weight", "present"));
  // The config alone says it is vLLM's (what an export's own check and check-export without
  // --for go by).
  const auto engines = engines_from_config(peagle().config);
  CHECK(engines.vllm);
  CHECK_FALSE(engines.sglang);
  CHECK(has(check(write_draft("peagle_sglang", peagle()), L, fsdp::model::ExportTarget::kSglang),
            Level::kError, "mask_hidden", "SGLang"));
  Draft d = peagle();
  d.config.erase("mask_token_id");
  CHECK(has(check(write_draft("peagle_nomask", d), L, vllm), Level::kError,
            "config.json:mask_token_id", "missing"));
  d = peagle();
  d["mask_hidden"] = at::randn({1, 1, 2 * H}).to(at::kBFloat16);
  CHECK(has(check(write_draft("peagle_short", d), L, vllm), Level::kError, "mask_hidden"));
}

TEST_CASE("wrong shapes and dtypes name the tensor", "[cpu]") {
  Draft d = good_draft();
  d["fc.weight"] = at::zeros({H, 2 * H}, at::kBFloat16);
  auto f = check(write_draft("fc_shape", d));
  INFO(dump(f));
  CHECK(has(f, Level::kError, "fc.weight", "expected [8, 24]"));

  d = good_draft();
  d["midlayer.mlp.up_proj.weight"] = at::zeros({I, H}, at::kInt);
  f = check(write_draft("int_weight", d));
  CHECK(has(f, Level::kError, "midlayer.mlp.up_proj.weight", "I32"));

  d = good_draft();
  d["d2t"] = at::zeros({Vd}, at::kFloat);
  f = check(write_draft("float_d2t", d));
  CHECK(has(f, Level::kError, "d2t", "F32"));
}

TEST_CASE("d2t and t2d consistency", "[cpu]") {
  Draft d = good_draft();
  d["d2t"][3] = 0;  // target ids ..., 4, 3, 8, ...: not increasing
  auto f = check(write_draft("d2t_order", d));
  INFO(dump(f));
  CHECK(has(f, Level::kError, "d2t", "not strictly increasing at j = 3"));

  d = good_draft();
  d["d2t"][Vd - 1] = 100;  // 15 + 100 >= V
  f = check(write_draft("d2t_range", d));
  CHECK(has(f, Level::kError, "d2t", "outside the target vocabulary"));

  d = good_draft();
  d["t2d"][0] = false;  // still Vd true entries, but not at d2t's targets
  d["t2d"][1] = true;
  f = check(write_draft("t2d_inverse", d));
  CHECK(has(f, Level::kError, "t2d", "t2d[0] is false"));

  d = good_draft();
  d["t2d"][1] = true;  // Vd + 1 entries
  f = check(write_draft("t2d_count", d));
  CHECK(has(f, Level::kError, "t2d", "17 true entries"));
}

TEST_CASE("aux ids: range, engines disagreeing, conventions", "[cpu]") {
  Draft d = good_draft();
  d.config["eagle_aux_hidden_state_layer_ids"] = {2, 4, 9};
  d.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 3, 8};
  auto f = check(write_draft("aux_range", d));
  INFO(dump(f));
  CHECK(has(f, Level::kError, kTopIds, "hidden_states[9]"));

  // hidden_states[L]: captured before the final norm by the engines, after it by HF.
  d.config["eagle_aux_hidden_state_layer_ids"] = {2, 4, 8};
  d.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 3, 7};
  f = check(write_draft("aux_last", d));
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kWarn, kTopIds, "hidden_states[8]"));

  // SpecForge-style: eagle_config ids only, [1, 15, 26]: vLLM reads them as hidden_states
  // indices, SGLang adds one.
  d = good_draft();
  d.config.erase("eagle_aux_hidden_state_layer_ids");
  d.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 15, 26};
  const fs::path specforge = write_draft("specforge", d);
  f = check(specforge, 32);
  CHECK(has(f, Level::kError, kNestedIds,
            "vLLM reads hidden_states [1, 15, 26] but SGLang reads "
            "hidden_states [2, 16, 27]"));
  // Only one engine named: the other's reading is a warning.
  f = check(specforge, 32, fsdp::model::ExportTarget::kSglang);
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kWarn, kNestedIds, "vLLM would read"));

  // SGLang before PR #25454 adds one to ids whose first is not 1.
  d = good_draft();
  d.config["eagle_aux_hidden_state_layer_ids"] = {3, 4, 7};
  d.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {3, 4, 7};
  f = check(write_draft("legacy", d));
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kWarn, kTopIds, "PR #25454"));

  // Four ids for an fc of three layers.
  d = good_draft();
  d.config["eagle_aux_hidden_state_layer_ids"] = {1, 2, 4, 7};
  d.config.erase("eagle_config");
  f = check(write_draft("aux_count", d), L, fsdp::model::ExportTarget::kVllm);
  CHECK(has(f, Level::kError, "fc.weight", "expected [8, 32]"));
  CHECK(has(f, Level::kError, kTopIds, "vLLM captures 4"));
}

TEST_CASE("config fields: rope schemas, vocab, tie, architectures", "[cpu]") {
  Draft d = good_draft();
  d.config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  d.config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  auto f = check(write_draft("rope_bad", d));
  INFO(dump(f));
  CHECK(has(f, Level::kError, "config.json:rope_parameters", "factor"));
  d.config["rope_parameters"]["factor"] = 2.0;
  f = check(write_draft("rope_good", d));
  CHECK(errors(f) == 0);
  CHECK(has(f, Level::kOk, "config.json:rope_parameters", "agrees"));
  d.config["rope_parameters"]["rope_theta"] = 500000.0;
  f = check(write_draft("rope_theta", d));
  CHECK(has(f, Level::kError, "config.json:rope_parameters", "rope_theta"));

  d = good_draft();
  d.config.erase("draft_vocab_size");
  f = check(write_draft("no_vd", d));
  CHECK(has(f, Level::kError, "config.json:draft_vocab_size"));

  d = good_draft();
  d.config["tie_word_embeddings"] = true;
  f = check(write_draft("tied", d));
  CHECK(has(f, Level::kError, "config.json:tie_word_embeddings"));

  d = good_draft();
  d.config["architectures"] = {"Eagle3LlamaForCausalLM"};  // vLLM's name, not SGLang's
  const fs::path speculators = write_draft("arch", d);
  CHECK(has(check(speculators), Level::kError, "config.json:architectures"));
  CHECK(!has(check(speculators, L, fsdp::model::ExportTarget::kVllm), Level::kError,
             "config.json:architectures"));
}

TEST_CASE("tensor names: model. prefix and speculators' layers.0", "[cpu]") {
  Draft d = good_draft();
  for (auto& [n, t] : d.tensors)
    if (n.rfind("midlayer.", 0) == 0) n = "model." + n;
  const fs::path prefixed = write_draft("prefixed", d);
  auto f = check(prefixed, L, fsdp::model::ExportTarget::kSglang);
  INFO(dump(f));
  CHECK(errors(f) == 0);  // SGLang reads model.<name>
  f = check(prefixed, L, fsdp::model::ExportTarget::kVllm);
  CHECK(has(f, Level::kError, "model.midlayer.mlp.up_proj.weight", "vLLM"));

  d = good_draft();
  for (auto& [n, t] : d.tensors)
    if (n.rfind("midlayer.", 0) == 0) n = "layers.0." + n.substr(9);
  const fs::path layers0 = write_draft("layers0", d);
  CHECK(errors(check(layers0, L, fsdp::model::ExportTarget::kVllm)) == 0);
  CHECK(has(check(layers0, L, fsdp::model::ExportTarget::kSglang), Level::kError,
            "layers.0.mlp.up_proj.weight", "SGLang"));
}

TEST_CASE("hostile and missing files are findings, not crashes", "[cpu]") {
  // Truncated safetensors: cut in the middle of the tensor data, and inside the header.
  const fs::path dir = write_draft("truncated", good_draft());
  const auto size = fs::file_size(dir / "model.safetensors");
  for (uint64_t keep : {size / 2, uint64_t{20}, uint64_t{3}}) {
    fs::resize_file(dir / "model.safetensors", keep);
    const auto f = check(dir);
    INFO(keep << "\n" << dump(f));
    CHECK(has(f, Level::kError, "model.safetensors"));
  }
  // A (sparse) file whose t2d claims 2^29 entries: refused, not read into memory.
  Draft big = good_draft();
  big.config["vocab_size"] = int64_t{1} << 29;  // matches the shape: only the cap refuses it
  const fs::path huge = write_draft("huge_t2d", big);
  {
    const uint64_t n = uint64_t{1} << 29;
    const std::string header =
        json{{"t2d", {{"dtype", "BOOL"}, {"shape", {n}}, {"data_offsets", {0, n}}}}}.dump();
    std::ofstream out(huge / "model.safetensors", std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header.size() >> (8 * i)) & 0xff));
    out << header;
  }
  fs::resize_file(huge / "model.safetensors", 8 + 200 + (uint64_t{1} << 29));
  auto h = check(huge);
  INFO(dump(h));
  CHECK(has(h, Level::kError, "t2d", "no vocabulary is that large"));
  // Corrupt JSON.
  const fs::path bad_json = write_draft("bad_json", good_draft());
  std::ofstream(bad_json / "config.json") << "{\"hidden_size\": 8,";
  auto f = check(bad_json);
  INFO(dump(f));
  CHECK(has(f, Level::kError, "config.json", "not valid JSON"));
  // No config at all; pickled weights only; shards without an index.
  const fs::path empty = fresh_dir("empty");
  std::ofstream(empty / "pytorch_model.bin") << "x";
  f = check(empty);
  CHECK(has(f, Level::kError, "config.json", "missing"));
  CHECK(has(f, Level::kError, "model.safetensors", "pytorch_model.bin"));
  // A hostile index naming a file outside the directory.
  const fs::path sharded = write_draft("sharded", good_draft());
  fs::rename(sharded / "model.safetensors", sharded / "model-00001-of-00001.safetensors");
  f = check(sharded);
  CHECK(has(f, Level::kError, "model.safetensors.index.json", "missing"));
  json index = {{"weight_map", json::object()}};
  for (const auto& [n, t] : good_draft().tensors)
    index["weight_map"][n] = "model-00001-of-00001.safetensors";
  std::ofstream(sharded / "model.safetensors.index.json") << index.dump();
  f = check(sharded);
  CHECK(errors(f) == 0);
  index["weight_map"]["norm.weight"] = "/etc/passwd";
  std::ofstream(sharded / "model.safetensors.index.json") << index.dump();
  f = check(sharded);
  CHECK(has(f, Level::kError, "model.safetensors.index.json:norm.weight", "not a file name"));
}

TEST_CASE("write_draft_export checks itself and fails on an ERROR", "[cpu]") {
  Draft d = good_draft();
  std::map<std::string, at::Tensor> state;
  for (const auto& [n, t] : d.tensors)
    if (n != "d2t" && n != "t2d") state[n] = t.to(at::kFloat);
  const fs::path dir = fresh_dir("self_check");
  CHECK_NOTHROW(write_draft_export(dir.string(), d.config.dump(), state, d["d2t"], d["t2d"]));
  // Written for vLLM (`--export-for vllm`): eagle_config mirrors the ids, which SGLang reads
  // one higher: a warning, not a failed save.
  d.config["eagle_aux_hidden_state_layer_ids"] = {1, 3, 6};
  d.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 3, 6};
  CHECK_NOTHROW(write_draft_export(dir.string(), d.config.dump(), state, d["d2t"], d["t2d"]));
  d.config["tie_word_embeddings"] = true;
  try {
    write_draft_export(dir.string(), d.config.dump(), state, d["d2t"], d["t2d"]);
    FAIL("no error");
  } catch (const fsdp::Error& e) {
    CHECK(std::string(e.message()).find("tie_word_embeddings") != std::string::npos);
  }
}

TEST_CASE("the target's layer count: num_hidden_layers or text_config's", "[cpu]") {
  const fs::path dir = fresh_dir("target");
  std::ofstream(dir / "config.json") << R"({"num_hidden_layers": 30})";
  CHECK(target_num_hidden_layers(dir.string()) == 30);
  std::ofstream(dir / "config.json") << R"({"text_config": {"num_hidden_layers": 28}})";
  CHECK(target_num_hidden_layers(dir.string()) == 28);
  std::ofstream(dir / "config.json") << R"({"hidden_size": 8})";
  CHECK_THROWS_AS(target_num_hidden_layers(dir.string()), fsdp::UsageError);
  CHECK_THROWS_AS(target_num_hidden_layers((dir / "none").string()), fsdp::UsageError);
}
