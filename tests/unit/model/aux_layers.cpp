// Target-layer conventions (docs/serving.md "Target layers"): what the trainer resolves from a
// draft config, what vLLM 0.32 and SGLang read from an export (their loaders' rules, written out
// here independently of lib/model/aux_layers.cpp), and that every --export-for makes the engines
// it serves read the trained layers.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "model/aux_layers.h"

using namespace fsdp::model;
using json = nlohmann::json;
using Ids = std::vector<int64_t>;

namespace {

constexpr const char* kKey = "eagle_aux_hidden_state_layer_ids";

// vLLM 0.32 (gpu_model_runner / eagle3_utils): top-level ids, else eagle_config's; the capture
// keeps tuple(sorted(set(ids))) and _maybe_add_hidden_state(idx + 1) after layer idx, so id k is
// the residual stream after k layers.
std::optional<Ids> vllm_rule(const json& cfg) {
  json ids;
  if (cfg.contains(kKey) && !cfg[kKey].empty())
    ids = cfg[kKey];
  else if (cfg.contains("eagle_config") && cfg["eagle_config"].contains(kKey))
    ids = cfg["eagle_config"][kKey];
  if (ids.is_null() || ids.empty()) return std::nullopt;
  Ids v = ids.get<Ids>();
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// SGLang model_runner: eagle_config["eagle_aux_hidden_state_layer_ids"] only; llama.py
// set_eagle3_layers_to_capture: layers_to_capture = [id + 1] (since PR #25454 only when the first
// id is 1), and the capture fires before layer i, i.e. on the stream after i layers.
std::optional<Ids> sglang_rule(const json& cfg, bool legacy) {
  if (!cfg.contains("eagle_config") || !cfg["eagle_config"].contains(kKey)) return std::nullopt;
  Ids v = cfg["eagle_config"][kKey].get<Ids>();
  if (v.empty()) return std::nullopt;
  if (legacy || v.front() == 1)
    for (auto& x : v) ++x;
  std::sort(v.begin(), v.end());
  return v;
}

std::string draft(const json& extra) {
  json c = {{"architectures", {"LlamaForCausalLMEagle3"}},
            {"hidden_size", 64},
            {"rope_theta", 10000.0},
            {"rope_scaling", nullptr}};
  for (auto& [k, v] : extra.items()) c[k] = v;
  return c.dump();
}

}  // namespace

TEST_CASE("conventions convert both ways") {
  CHECK(to_hidden_state_index({1, 14, 26}, AuxIdConvention::kLayerOutput) == Ids{2, 15, 27});
  CHECK(to_hidden_state_index({2, 15, 27}, AuxIdConvention::kHiddenStateIndex) == Ids{2, 15, 27});
  CHECK(from_hidden_state_index({2, 15, 27}, AuxIdConvention::kLayerOutput) == Ids{1, 14, 26});
  // SpecForge's default [1, L/2-1, L-4] and vLLM's (2, L/2, L-3) are the same tensors.
  for (int64_t L : {30, 32, 36, 80}) {
    const Ids specforge{1, L / 2 - 1, L - 4};
    CHECK(to_hidden_state_index(specforge, AuxIdConvention::kLayerOutput) ==
          default_hidden_state_index(L));
    CHECK(default_hidden_state_index(L) == Ids{2, L / 2, L - 3});
  }
  CHECK(parse_convention("layer-output") == AuxIdConvention::kLayerOutput);
  CHECK(parse_convention("hidden-state-index") == AuxIdConvention::kHiddenStateIndex);
  CHECK_FALSE(parse_convention("vllm").has_value());
}

TEST_CASE("resolve_aux_layers reads eagle_config, the top-level key, or the default") {
  const json nested = {{"eagle_config", {{kKey, {1, 14, 26}}}}};
  auto a = resolve_aux_layers(draft(nested), AuxIdConvention::kLayerOutput, 30, "d.json");
  REQUIRE(a);
  CHECK(a->hidden_state_index == Ids{2, 15, 27});
  CHECK(a->origin.find("eagle_config") != std::string::npos);
  a = resolve_aux_layers(draft(nested), AuxIdConvention::kHiddenStateIndex, 30, "d.json");
  CHECK(a->hidden_state_index == Ids{1, 14, 26});
  a = resolve_aux_layers(draft({{kKey, {2, 15, 27}}}), AuxIdConvention::kLayerOutput, 30, "d");
  CHECK(a->hidden_state_index == Ids{2, 15, 27});  // top level: always vLLM's meaning
  a = resolve_aux_layers(draft({}), AuxIdConvention::kLayerOutput, 30, "d");
  CHECK(a->hidden_state_index == Ids{2, 15, 27});
  CHECK_FALSE(resolve_aux_layers(draft({}), AuxIdConvention::kLayerOutput, 0, "d").has_value());
  // A 2-layer (toy) target has no default [2, L/2, L-3] of three distinct layers.
  CHECK_FALSE(resolve_aux_layers(draft({}), AuxIdConvention::kLayerOutput, 2, "d").has_value());
  CHECK(resolve_aux_layers(draft({}), AuxIdConvention::kLayerOutput, 7, "d")->hidden_state_index ==
        Ids{2, 3, 4});
  // Both keys present and agreeing is fine; disagreeing is an error.
  json both = nested;
  both[kKey] = {2, 15, 27};
  CHECK(resolve_aux_layers(draft(both), AuxIdConvention::kLayerOutput, 30, "d"));
  both[kKey] = {1, 14, 26};
  CHECK_THROWS_AS(resolve_aux_layers(draft(both), AuxIdConvention::kLayerOutput, 30, "d"),
                  fsdp::UsageError);
}

TEST_CASE("resolve_aux_layers refuses ids the engines would read otherwise") {
  auto bad = [](const json& ids, int64_t L) {
    return resolve_aux_layers(draft({{"eagle_config", {{kKey, ids}}}}),
                              AuxIdConvention::kLayerOutput, L, "d.json");
  };
  CHECK_THROWS_AS(bad({14, 1, 26}, 30), fsdp::UsageError);  // engines capture ascending
  CHECK_THROWS_AS(bad({1, 14, 14}, 30), fsdp::UsageError);
  CHECK_THROWS_AS(bad({1, 14, 30}, 30), fsdp::UsageError);  // hidden_states[31] of 30 layers
  CHECK_THROWS_AS(bad({-2, 14, 26}, 30), fsdp::UsageError);
  CHECK_THROWS_AS(bad({"a", 14, 26}, 30), fsdp::UsageError);
  CHECK(bad({1, 14, 29}, 30));  // hidden_states[30]: the last layer's output exists
  CHECK(bad({1, 14, 40}, 0));   // unknown layer count: range not checked
  CHECK_THROWS_AS(resolve_aux_layers("[1, 2]", AuxIdConvention::kLayerOutput, 30, "d"),
                  fsdp::UsageError);
}

TEST_CASE("the library's engine readings equal the engines' rules") {
  const std::vector<std::string> configs = {
      draft({}),
      draft({{"eagle_config", {{kKey, {1, 14, 26}}}}}),
      draft({{"eagle_config", {{kKey, {2, 15, 27}}}}}),
      draft({{"eagle_config", {{kKey, {3, 10, 20}}}}}),
      draft({{kKey, {2, 15, 27}}, {"eagle_config", {{kKey, {1, 14, 26}}}}}),
      draft({{kKey, {27, 2, 15, 15}}}),
  };
  for (const auto& text : configs) {
    const json cfg = json::parse(text);
    CHECK(vllm_reads(text) == vllm_rule(cfg));
    CHECK(sglang_reads(text, false) == sglang_rule(cfg, false));
    CHECK(sglang_reads(text, true) == sglang_rule(cfg, true));
  }
}

TEST_CASE("every export target makes its engines read the trained layers") {
  const std::vector<Ids> layer_sets = {{2, 15, 27}, {3, 10, 20}, {0, 5, 9}, {2, 16, 29}, {1, 5, 9}};
  for (const Ids& hs : layer_sets) {
    const AuxLayers aux{hs, "test"};
    for (ExportTarget t : {ExportTarget::kEngines, ExportTarget::kVllm, ExportTarget::kSglang,
                           ExportTarget::kSpecForge}) {
      CAPTURE(export_target_name(t), hs);
      const bool sglang_possible = hs.front() != 1;
      if (t == ExportTarget::kSglang && !sglang_possible) {
        CHECK_THROWS_AS(serving_config_json(draft({}), aux, t), fsdp::UsageError);
        continue;
      }
      const json out = json::parse(serving_config_json(draft({}), aux, t));
      if (t == ExportTarget::kEngines || t == ExportTarget::kVllm) CHECK(vllm_rule(out) == hs);
      if ((t == ExportTarget::kEngines || t == ExportTarget::kSglang) && sglang_possible)
        CHECK(sglang_rule(out, false) == hs);
      // The default layers (first index 2) are read right by SGLang before PR #25454 too.
      if ((t == ExportTarget::kEngines || t == ExportTarget::kSglang) && hs.front() == 2)
        CHECK(sglang_rule(out, true) == hs);
      if (t == ExportTarget::kSpecForge) {
        CHECK_FALSE(out.contains(kKey));
        CHECK(out["eagle_config"][kKey].get<Ids>() ==
              from_hidden_state_index(hs, AuxIdConvention::kLayerOutput));
      }
    }
  }
}

TEST_CASE("exports write RoPE in both schemas and inject a scaling") {
  json cfg = json::parse(
      serving_config_json(draft({{"rope_theta", 500000.0}}), std::nullopt, ExportTarget::kEngines));
  CHECK(cfg["rope_scaling"].is_null());
  CHECK(cfg["rope_parameters"] == json({{"rope_type", "default"}, {"rope_theta", 500000.0}}));
  const auto yarn = parse_rope_override("yarn:32", 2048);
  cfg = json::parse(serving_config_json(draft({{"max_position_embeddings", 4096}}), std::nullopt,
                                        ExportTarget::kEngines, yarn));
  CHECK(cfg["rope_scaling"]["rope_type"] == "yarn");
  CHECK(cfg["rope_scaling"]["factor"] == 32.0);
  CHECK(cfg["rope_scaling"]["original_max_position_embeddings"] == 2048);
  CHECK(cfg["rope_parameters"]["rope_type"] == "yarn");
  CHECK(cfg["rope_parameters"]["rope_theta"] == 10000.0);
  CHECK(cfg["max_position_embeddings"] == 65536);
  // A legacy "type" key is carried as rope_type into both schemas.
  const auto linear = parse_rope_override(R"({"type": "linear", "factor": 2.0})", 0);
  cfg = json::parse(serving_config_json(draft({}), std::nullopt, ExportTarget::kVllm, linear));
  CHECK(cfg["rope_scaling"]["rope_type"] == "linear");
  CHECK_FALSE(cfg["rope_parameters"].contains("type"));
  CHECK_THROWS_AS(parse_rope_override("yarn:0.5", 2048), fsdp::UsageError);
  CHECK_THROWS_AS(parse_rope_override("yarn:abc", 2048), fsdp::UsageError);
  CHECK_THROWS_AS(parse_rope_override("yarn:32", 0), fsdp::UsageError);
  CHECK_THROWS_AS(parse_rope_override(R"({"factor": 2})", 0), fsdp::UsageError);
  CHECK_THROWS_AS(parse_rope_override("[1]", 0), fsdp::UsageError);
  CHECK(parse_rope_override("", 2048).rope_scaling_json.empty());
}
