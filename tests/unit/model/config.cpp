// Draft config loader: the shipped configs, defaults, unknown keys carried through to_json(),
// closed-form parameter counts against the headline numbers of docs/reference.md §9, and error
// messages that name the key and the file.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/draft_config.h"
#include "model/flops.h"
#include "support/test_paths.h"

using namespace fsdp::model;

namespace {

std::string config_path(const std::string& name) {
  return std::string(FSDP_SOURCE_DIR) + "/configs/models/" + name;
}

const char* kTiny = R"({
  "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "intermediate_size": 128,
  "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
  "vocab_size": 512, "draft_vocab_size": 256, "rms_norm_eps": 1e-5,
  "max_position_embeddings": 512, "my_custom_key": {"a": [1, 2]}, "model_type": "llama"})";

// Replaces (or with value "" removes) one key of kTiny and returns the error message.
std::string error_for(const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(kTiny);
  if (value.empty()) {
    j.erase(key);
  } else {
    j[key] = nlohmann::json::parse(value);
  }
  try {
    parse_draft_config(j.dump(), "test.json");
  } catch (const fsdp::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("shipped llama3-8B config has the reference's values and parameter count",
          "[model][config]") {
  DraftConfig c = load_draft_config(config_path("llama3-8B-eagle3.json"));
  CHECK(c.hidden_size == 4096);
  CHECK(c.num_attention_heads == 32);
  CHECK(c.num_key_value_heads == 8);
  CHECK(c.intermediate_size == 14336);
  CHECK(c.vocab_size == 128256);
  CHECK(c.draft_vocab() == 32000);
  CHECK(c.max_position_embeddings == 2048);
  CHECK(c.rms_norm_eps == Approx(1e-5));
  CHECK(c.rope_theta == 10000.0);  // absent: default
  CHECK(c.rope_scaling.type == RopeType::kDefault);
  CHECK(c.head_dim_value() == 128);
  // Derived by hand: fc 4096*12288 = 50331648; q 4096*8192 = 33554432; k, v 1024*8192 each =
  // 16777216; o 4096*4096 = 16777216; mlp 3*4096*14336 = 176160768; lm_head 32000*4096 =
  // 131072000; four norms 4*4096 = 16384. Sum = 424689664 (~424.7 M, docs/reference.md §9).
  ParamCounts p = count_parameters(c);
  CHECK(p.trainable == 424689664);
  CHECK(p.frozen_embedding == int64_t{128256} * 4096);
  CHECK(p.buffers == 32000 + 128256);
}

TEST_CASE("shipped gpt-oss-120B config has the reference's values and parameter count",
          "[model][config]") {
  DraftConfig c = load_draft_config(config_path("gpt-oss-120B-eagle3.json"));
  CHECK(c.hidden_size == 2880);
  CHECK(c.num_attention_heads == 64);
  CHECK(c.num_key_value_heads == 8);
  CHECK(c.head_dim_value() == 64);
  CHECK(c.intermediate_size == 17280);
  CHECK(c.vocab_size == 201088);
  CHECK(c.draft_vocab() == 32000);
  CHECK(c.max_position_embeddings == 4096);
  CHECK(nlohmann::json::parse(c.eagle_config_json)["eagle_aux_hidden_state_layer_ids"] ==
        nlohmann::json::parse("[1,17,33]"));
  // By hand: fc 2880*8640 = 24883200; q 4096*5760 = 23592960; k, v 512*5760 each = 5898240;
  // o 2880*4096 = 11796480; mlp 3*2880*17280 = 149299200; lm_head 32000*2880 = 92160000;
  // norms 4*2880 = 11520. Sum = 307641600 (~307.6 M); embedding 201088*2880 = 579133440 (~579 M).
  ParamCounts p = count_parameters(c);
  CHECK(p.trainable == 307641600);
  CHECK(p.frozen_embedding == 579133440);
}

TEST_CASE("tiny configs load", "[model][config]") {
  DraftConfig t = load_draft_config(config_path("tiny-eagle3.json"));
  CHECK(t.hidden_size == 64);
  CHECK(t.head_dim_value() == 16);
  CHECK(t.draft_vocab() == 256);
  DraftConfig y = load_draft_config(config_path("tiny-yarn-eagle3.json"));
  CHECK(y.rope_scaling.type == RopeType::kYarn);
  CHECK(y.rope_scaling.factor == 4.0);
  CHECK_FALSE(y.rope_scaling.truncate);
  CHECK(y.rope_scaling.original_max_position_embeddings == 64);
  CHECK(y.fc_in_features() == 120);
  CHECK(y.rope_theta == 150000.0);
}

TEST_CASE("defaults: draft_vocab_size null means vocab_size, nkv defaults to nh",
          "[model][config]") {
  auto j = nlohmann::json::parse(kTiny);
  j["draft_vocab_size"] = nullptr;
  j.erase("num_key_value_heads");
  j.erase("rms_norm_eps");
  j["tie_word_embeddings"] = true;  // forced false
  DraftConfig c = parse_draft_config(j.dump(), "x.json");
  CHECK(c.draft_vocab() == 512);
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK_FALSE(c.tie_word_embeddings);
}

TEST_CASE("to_json carries unknown keys, eagle_config and rope_scaling through",
          "[model][config]") {
  auto j = nlohmann::json::parse(kTiny);
  j["eagle_config"] = nlohmann::json::parse(R"({"eagle_aux_hidden_state_layer_ids": [2, 5, 9]})");
  j["rope_scaling"] = nlohmann::json::parse(
      R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "some_future_key": 3})");
  j.erase("draft_vocab_size");
  DraftConfig c = parse_draft_config(j.dump(), "x.json");
  auto out = nlohmann::json::parse(c.to_json());
  CHECK(out["architectures"] == nlohmann::json::parse(R"(["LlamaForCausalLMEagle3"])"));
  CHECK(out["draft_vocab_size"] == 512);  // always written
  CHECK(out["tie_word_embeddings"] == false);
  CHECK(out["my_custom_key"] == j["my_custom_key"]);
  CHECK(out["model_type"] == "llama");
  CHECK(out["eagle_config"] == j["eagle_config"]);
  CHECK(out["rope_scaling"] == j["rope_scaling"]);
  // Round trip gives the same config.
  DraftConfig again = parse_draft_config(c.to_json(), "again.json");
  CHECK(again.to_json() == c.to_json());
  CHECK(again.rope_scaling.type == RopeType::kLlama3);
  CHECK(again.rope_scaling.original_max_position_embeddings == 8192);
}

TEST_CASE("config errors name the key and the file", "[model][config]") {
  std::string e = error_for("hidden_size", "");
  CHECK_THAT(e, Catch::Contains("test.json") && Catch::Contains("'hidden_size'") &&
                    Catch::Contains("missing"));
  e = error_for("architectures", R"(["LlamaForCausalLM"])");
  CHECK_THAT(e, Catch::Contains("test.json") && Catch::Contains("'architectures'") &&
                    Catch::Contains("LlamaForCausalLMEagle3"));
  e = error_for("rope_scaling", R"({"rope_type": "dynamic", "factor": 2.0})");
  CHECK_THAT(e, Catch::Contains("test.json") && Catch::Contains("rope_scaling.rope_type") &&
                    Catch::Contains("'dynamic' is not supported"));
  e = error_for("num_hidden_layers", "0");
  CHECK_THAT(e, Catch::Contains("test.json") && Catch::Contains("'num_hidden_layers'") &&
                    Catch::Contains("not in [1, 64]"));
  e = error_for("hidden_size", R"("big")");
  CHECK_THAT(e, Catch::Contains("'hidden_size'") && Catch::Contains("integer"));
  e = error_for("hidden_act", R"("gelu")");
  CHECK_THAT(e, Catch::Contains("'hidden_act'"));
  e = error_for("attention_bias", "true");
  CHECK_THAT(e, Catch::Contains("'attention_bias'") && Catch::Contains("no bias terms"));
  e = error_for("mlp_bias", "true");
  CHECK_THAT(e, Catch::Contains("'mlp_bias'"));
  CHECK_THAT(error_for("attention_bias", "1"), Catch::Contains("no bias terms"));
  CHECK_THAT(error_for("attention_bias", R"("true")"), Catch::Contains("no bias terms"));
  CHECK(error_for("attention_bias", "null").empty());
  CHECK(error_for("attention_bias", "false").empty());  // false is what the draft is
  e = error_for("num_key_value_heads", "3");
  CHECK_THAT(e, Catch::Contains("'num_key_value_heads'") && Catch::Contains("divide"));
  e = error_for("draft_vocab_size", "1000");
  CHECK_THAT(e, Catch::Contains("'draft_vocab_size'") && Catch::Contains("exceeds"));
  e = error_for("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})");
  CHECK_THAT(e, Catch::Contains("rope_scaling.low_freq_factor") && Catch::Contains("llama3"));
  CHECK_THROWS_AS(parse_draft_config("{not json", "bad.json"), fsdp::UsageError);
  // A fuzz finding: a number too large for a double escaped as a JSON library exception.
  CHECK_THROWS_AS(parse_draft_config("{\"hidden_size\": 1e308128000}", "big.json"),
                  fsdp::UsageError);
  CHECK_THROWS_WITH(load_draft_config("/nonexistent/draft.json"),
                    Catch::Contains("/nonexistent/draft.json"));
}

TEST_CASE("FLOP count matches the closed form", "[model][flops]") {
  DraftConfig c = parse_draft_config(kTiny, "tiny");
  const int64_t B = 2, S = 10, T = 3;
  StepFlops f = count_step_flops(c, B, S, T);
  const double N = B * S, H = 64, I = 128, Vd = 256, V = 512, qo = 64, kvo = 32;
  const double layer = 2 * N * (2 * H * (qo + 2 * kvo) + qo * H + 3 * H * I);
  const double head = 2 * N * H * Vd;
  const double fc = 2 * N * 3 * H * H;
  // attention pairs: B*S(S+1)/2 = 110 per step plus N*i diagonal pairs: 110+130+150 = 390
  const double attn = 4 * qo * 390;
  CHECK(f.attention == Approx(attn));
  CHECK(f.forward == Approx(fc + 3 * (layer + head) + attn));
  CHECK(f.backward == Approx(fc + 2 * 3 * (layer + head) + 2 * attn));
  CHECK(f.target_head == Approx(2 * N * H * (Vd + V)));
  CHECK(f.total() == Approx(f.forward + f.backward + f.target_head));

  // Executed FLOPs with the heads on the loss rows only: 7, 6, 4 rows at steps 0, 1, 2.
  StepFlops r = count_step_flops(c, B, S, T, {7, 6, 4});
  const double row_head = 2 * H * Vd;
  CHECK(r.attention == Approx(attn));
  CHECK(r.forward == Approx(fc + 3 * layer + 17 * row_head + attn));
  CHECK(r.backward == Approx(fc + 2 * 3 * layer + 2 * 17 * row_head + 2 * attn));
  CHECK(r.target_head == Approx(2 * 7 * H * (Vd + V)));
  StepFlops all = count_step_flops(c, B, S, T, {B * S, B * S, B * S});
  CHECK(all.total() == Approx(f.total()));
  CHECK_THROWS_WITH(count_step_flops(c, B, S, T, {1, 2}), Catch::Contains("head_rows has 2"));
}

TEST_CASE("absurd sizes are refused with the numbers, not met as out of memory later",
          "[model][config]") {
  // 2^40: above any model's size, caught before anything multiplies it.
  std::string e = error_for("intermediate_size", "1099511627776");
  CHECK_THAT(e, Catch::Contains("key 'intermediate_size' is 1099511627776"));
  e = error_for("hidden_size", "4398046511104");
  CHECK_THAT(e, Catch::Contains("key 'hidden_size' is 4398046511104"));
  // 2^30 is a plausible-looking number whose parameters (3 x 64 x 2^30 = 2e11 in the MLP alone,
  // 14 bytes each: 2.6 TiB) fit in no host's memory: refused with the count and the sizes.
  e = error_for("intermediate_size", "1073741824");
  CHECK_THAT(e, Catch::Contains("trainable parameters (hidden_size 64, intermediate_size "
                                "1073741824"));
  CHECK_THAT(e, Catch::Contains("GiB"));
  CHECK_THAT(e, Catch::Contains("of memory"));
  // The shipped configs fit (checked by loading them above); the tiny one too.
  CHECK(error_for("intermediate_size", "256").empty());
}

TEST_CASE("transformers v5 rope_parameters is read, and must agree with rope_theta/rope_scaling",
          "[model][config]") {
  auto j = nlohmann::json::parse(kTiny);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  DraftConfig c = parse_draft_config(j.dump(), "v5.json");
  CHECK(c.rope_theta == 500000.0);  // not the 10000 default
  CHECK(c.rope_scaling.type == RopeType::kDefault);
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 1e6},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 128}};
  c = parse_draft_config(j.dump(), "v5.json");
  CHECK(c.rope_theta == 1e6);
  CHECK(c.rope_scaling.type == RopeType::kYarn);
  CHECK(c.rope_scaling.factor == 4.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 128);
  // Both schemas, agreeing: fine; disagreeing theta or scaling: an error naming the key.
  j["rope_theta"] = 1e6;
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 128}};
  CHECK(parse_draft_config(j.dump(), "both.json").rope_scaling.type == RopeType::kYarn);
  CHECK(error_for("rope_parameters", R"({"rope_type": "default", "rope_theta": 7.0})")
            .find("rope_parameters") ==
        std::string::npos);  // kTiny has no rope_theta: the v5 value is taken
  j["rope_theta"] = 10000.0;
  CHECK_THROWS_WITH(parse_draft_config(j.dump(), "both.json"),
                    Catch::Contains("rope_parameters.rope_theta"));
  j["rope_theta"] = 1e6;
  j["rope_scaling"]["factor"] = 8.0;
  CHECK_THROWS_WITH(parse_draft_config(j.dump(), "both.json"), Catch::Contains("rope_parameters"));
  CHECK(error_for("rope_parameters", "[1]").find("rope_parameters") != std::string::npos);
}

TEST_CASE("captured target layers: fc reads n x Ht, as vLLM counts them", "[model][config]") {
  // DeepSpec's recipe: five layers.
  const DraftConfig five = load_draft_config(config_path("qwen3-8B-eagle3-5aux.json"));
  CHECK(five.num_aux_hidden_states == 5);
  CHECK(five.fc_in_features() == 5 * 4096);
  // Written back for vLLM, which sizes fc from it.
  CHECK(nlohmann::json::parse(five.to_json()).at("num_aux_hidden_states") == 5);
  // Default 3, and not written then (the config stays as SpecForge writes it).
  const DraftConfig three = parse_draft_config(kTiny, "t.json");
  CHECK(three.num_aux_hidden_states == 3);
  CHECK(three.fc_in_features() == 3 * 64);
  CHECK_FALSE(nlohmann::json::parse(three.to_json()).contains("num_aux_hidden_states"));
  // The explicit count, the top-level list, and their disagreement.
  auto j = nlohmann::json::parse(kTiny);
  j["num_aux_hidden_states"] = 2;
  CHECK(parse_draft_config(j.dump(), "t.json").fc_in_features() == 2 * 64);
  j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {1, 5, 9, 12}}};
  try {
    parse_draft_config(j.dump(), "t.json");
    FAIL("a count that disagrees with the ids was accepted");
  } catch (const fsdp::UsageError& e) {
    CHECK(std::string(e.what()).find("num_aux_hidden_states") != std::string::npos);
    CHECK(std::string(e.what()).find("names 4 layers") != std::string::npos);
  }
  j.erase("num_aux_hidden_states");
  CHECK(parse_draft_config(j.dump(), "t.json").num_aux_hidden_states == 4);
  j.erase("eagle_config");
  j["eagle_aux_hidden_state_layer_ids"] = {2, 6};
  CHECK(parse_draft_config(j.dump(), "t.json").num_aux_hidden_states == 2);
  CHECK(error_for("num_aux_hidden_states", "0").find("not in [1, 64]") != std::string::npos);
}

TEST_CASE("keys that change the model and are not implemented are refused by name",
          "[model][config]") {
  // The variants are implemented (tests/unit/model/variants.cpp); these are not.
  CHECK(error_for("fc_norm", "true").empty());
  CHECK(error_for("logit_scale", "0.5").find("logit_scale") != std::string::npos);
  CHECK(error_for("eagle_config", R"({"use_aux_hidden_state": false})")
            .find("use_aux_hidden_state") != std::string::npos);
  // False (or absent) is plain EAGLE3: accepted and carried through.
  CHECK(error_for("fc_norm", "false").empty());
  CHECK(error_for("eagle_config", R"({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})").empty());
}
