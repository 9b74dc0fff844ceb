// The serving contract (checkpoint/serving_contract.h): its variant rule reads a config.json as
// the draft's own parse does, its engine choice follows the keys written, and the trainer's
// start-up plan refuses exports an engine would serve as another model.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/serving_contract.h"
#include "core/error.h"
#include "model/draft_config.h"

using namespace fsdp;
using nlohmann::json;

namespace {

const std::string kBase =
    R"({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 16,
        "intermediate_size": 24, "num_attention_heads": 4, "vocab_size": 40)";

}  // namespace

TEST_CASE("serving contract: variants read as the draft config reads them", "[cpu][checkpoint]") {
  // Each config is parsed as the trainer parses it and asked about in the config.json it writes,
  // so the contract reads the keys where the draft's own parse puts them.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},
      {R"(, "fc_norm": true, "norm_output": true)", "fc_norm, norm_output"},
      {R"(, "num_hidden_layers": 2)", "num_hidden_layers 2"},
      {R"(, "eagle_config": {"norm_before_fc": true})", "norm_before_fc"},
      {R"(, "norm_before_residual": true)", "norm_before_residual"},
      {R"(, "norm_output": false)", ""},
      {R"(, "num_hidden_layers": 3, "fc_norm": true)", "num_hidden_layers 3, fc_norm"}};
  for (const auto& [extra, variants] : cases) {
    INFO(extra);
    const model::DraftConfig c = model::parse_draft_config(kBase + extra + "}", "x.json");
    CHECK(checkpoint::vllm_only_variants(json::parse(c.to_json())) == variants);
  }
}

TEST_CASE("serving contract: engines from the config's keys", "[cpu][checkpoint]") {
  using checkpoint::engines_from_config;
  auto both = [](checkpoint::ServingEngines e) { return e.vllm && e.sglang; };
  auto vllm = [](checkpoint::ServingEngines e) { return e.vllm && !e.sglang; };
  CHECK(both(engines_from_config(json::parse(kBase + "}"))));
  CHECK(vllm(engines_from_config(json::parse(kBase + R"(, "fc_norm": true})"))));
  CHECK(vllm(engines_from_config(json::parse(kBase + R"(, "num_aux_hidden_states": 5})"))));
  const auto sg = engines_from_config(
      json::parse(kBase + R"(, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}})"));
  CHECK((!sg.vllm && sg.sglang));
  CHECK(checkpoint::kSglangFcLayers == 3);
}

TEST_CASE("serving contract: a vLLM-only variant is not exported for SGLang", "[cpu][checkpoint]") {
  checkpoint::ServingRequest r;
  r.draft_config_path = "draft.json";
  r.draft_config_json =
      model::parse_draft_config(kBase + R"(, "norm_output": true})", "x.json").to_json();
  r.export_for = model::ExportTarget::kSglang;
  CHECK_THROWS_AS(checkpoint::plan_serving_export(r), UsageError);
  r.export_for = model::ExportTarget::kVllm;
  const checkpoint::ServingPlan p = checkpoint::plan_serving_export(r);
  REQUIRE_FALSE(p.notes.empty());
  CHECK(p.notes.front().text.find("norm_output") != std::string::npos);
}
