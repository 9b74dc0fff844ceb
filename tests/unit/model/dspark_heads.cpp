// DSpark's heads: the config keys as SpecForge's DSparkDraftModel reads them (defaults, the
// top-level spelling vLLM reads, and errors that name the key and the file), the parameters'
// names, shapes and initialisation, and each Markov variant and the confidence head against the
// formula written out with plain tensor arithmetic in float64.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "model/dspark_heads.h"

using namespace fsdp::model;
using Catch::Matchers::Contains;

namespace {

const char* kConfig = R"({
  "architectures": ["DSparkDraftModel"], "hidden_size": 16, "vocab_size": 40,
  "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "block_size": 4,
  "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 39, "markov_rank": 6,
                    "markov_head_type": "gated", "enable_confidence_head": true,
                    "confidence_head_with_markov": true, "projector_type": "dspark"}})";

// kConfig with one key of dflash_config (or, with a "top." prefix, of the top level) replaced
// by `value` (JSON text; "" removes the key).
std::string edited(const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(kConfig);
  const bool top = key.rfind("top.", 0) == 0;
  nlohmann::json& where = top ? j : j["dflash_config"];
  const std::string k = top ? key.substr(4) : key;
  if (value.empty()) {
    where.erase(k);
  } else {
    where[k] = nlohmann::json::parse(value);
  }
  return j.dump();
}

DSparkHeadsConfig parse(const std::string& key, const std::string& value) {
  return parse_dspark_heads_config(edited(key, value), "draft.json");
}

// The UsageError message for an edited config ("" when it parses).
std::string error_for(const std::string& key, const std::string& value) {
  try {
    parse(key, value);
  } catch (const fsdp::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("dspark config: SpecForge's dflash_config keys and their defaults", "[model][dspark]") {
  const DSparkHeadsConfig c = parse_dspark_heads_config(kConfig, "draft.json");
  CHECK(c.vocab_size == 40);
  CHECK(c.hidden_size == 16);
  CHECK(c.markov_rank == 6);
  CHECK(c.markov_head_type == MarkovHeadType::kGated);
  CHECK(c.enable_confidence_head);
  CHECK(c.confidence_head_with_markov);
  CHECK(c.confidence_input_dim() == 22);
  CHECK(c.attention_mode == "gqa");
  CHECK(c.initializer_range == 0.02);

  // Nothing DSpark-specific: no Markov head, no confidence head.
  auto bare = nlohmann::json::parse(kConfig);
  bare.erase("dflash_config");
  const DSparkHeadsConfig d = parse_dspark_heads_config(bare.dump(), "bare.json");
  CHECK(d.markov_rank == 0);
  CHECK_FALSE(d.has_markov_head());
  CHECK_FALSE(d.enable_confidence_head);
  CHECK(d.confidence_input_dim() == 16);

  auto rank_null = nlohmann::json::parse(edited("markov_rank", "null"));
  rank_null["dflash_config"]["confidence_head_with_markov"] = false;
  CHECK(parse_dspark_heads_config(rank_null.dump()).markov_rank == 0);  // int(None or 0)
  CHECK(parse("markov_rank", "8.0").markov_rank == 8);
  CHECK(parse("markov_head_type", "\"RNN\"").markov_head_type == MarkovHeadType::kRnn);
  CHECK(parse("markov_head_type", "").markov_head_type == MarkovHeadType::kVanilla);
  // The type is not read without a head (SpecForge builds none).
  auto no_head = nlohmann::json::parse(edited("markov_rank", "0"));
  no_head["dflash_config"]["markov_head_type"] = "anything";
  no_head["dflash_config"]["confidence_head_with_markov"] = false;
  CHECK(parse_dspark_heads_config(no_head.dump()).markov_rank == 0);
  // enable_confidence_head defaults to confidence_head_alpha > 0.
  auto alpha = nlohmann::json::parse(edited("enable_confidence_head", ""));
  alpha["dflash_config"]["confidence_head_alpha"] = 0.5;
  CHECK(parse_dspark_heads_config(alpha.dump()).enable_confidence_head);
  alpha["dflash_config"]["confidence_head_alpha"] = 0;
  CHECK_FALSE(parse_dspark_heads_config(alpha.dump()).enable_confidence_head);
  alpha["dflash_config"]["enable_confidence_head"] = true;
  CHECK(parse_dspark_heads_config(alpha.dump()).enable_confidence_head);
  // attention_mode mha with equal head counts.
  auto mha = nlohmann::json::parse(edited("attention_mode", "\"MHA\""));
  mha["num_key_value_heads"] = 4;
  CHECK(parse_dspark_heads_config(mha.dump()).attention_mode == "mha");
  // HF's `initializer_range or 0.02`.
  CHECK(parse("top.initializer_range", "0").initializer_range == 0.02);
  CHECK(parse("top.initializer_range", "0.05").initializer_range == 0.05);
}

TEST_CASE("dspark config: the top-level spelling vLLM reads", "[model][dspark]") {
  auto j = nlohmann::json::parse(kConfig);
  const nlohmann::json method = j["dflash_config"];
  j["dflash_config"] = {{"target_layer_ids", {1, 3}}};
  for (const char* k :
       {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"})
    j[k] = method[k];
  const DSparkHeadsConfig c = parse_dspark_heads_config(j.dump(), "vllm.json");
  CHECK(c.markov_rank == 6);
  CHECK(c.markov_head_type == MarkovHeadType::kGated);
  CHECK(c.confidence_head_with_markov);
  // Both spellings with one value: fine; with two: an error naming both.
  j["dflash_config"]["markov_rank"] = 6;
  CHECK(parse_dspark_heads_config(j.dump()).markov_rank == 6);
  j["dflash_config"]["markov_rank"] = 8;
  CHECK_THROWS_AS(parse_dspark_heads_config(j.dump(), "both.json"), fsdp::UsageError);
  CHECK_THROWS_WITH(
      parse_dspark_heads_config(j.dump(), "both.json"),
      Contains("dflash_config.markov_rank") && Contains("both.json") && Contains("'markov_rank'"));
}

TEST_CASE("dspark config: the keys an export writes, and early checkpoints' names",
          "[model][dspark]") {
  const DSparkHeadsConfig c = parse_dspark_heads_config(kConfig);
  const auto keys = nlohmann::json::parse(c.keys_json());
  CHECK(keys == nlohmann::json::parse(R"({"markov_rank": 6, "markov_head_type": "gated",
      "enable_confidence_head": true, "confidence_head_with_markov": true})"));
  // Written at both places, they parse back to the same heads.
  auto j = nlohmann::json::parse(kConfig);
  j.update(keys);
  j["dflash_config"].update(keys);
  const DSparkHeadsConfig back = parse_dspark_heads_config(j.dump());
  CHECK(back.markov_rank == 6);
  CHECK(back.markov_head_type == MarkovHeadType::kGated);
  CHECK(back.confidence_input_dim() == c.confidence_input_dim());

  CHECK(dspark_state_dict_name("logit_head.markov_head.markov_w1.weight") ==
        "markov_head.markov_w1.weight");
  CHECK(dspark_state_dict_name("logit_head.confidence_head.proj.bias") ==
        "confidence_head.proj.bias");
  CHECK(dspark_state_dict_name("logit_head.prefix_gru.weight_ih_l0") == "prefix_gru.weight_ih_l0");
  CHECK(dspark_state_dict_name("logit_head.other.weight") == "logit_head.other.weight");
  CHECK(dspark_state_dict_name("markov_head.markov_w2.weight") == "markov_head.markov_w2.weight");
  CHECK(dspark_state_dict_name("layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight");
}

TEST_CASE("dspark config: bad values name the key and the file", "[model][dspark]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"markov_rank", "-1"},
      {"markov_rank", "\"16\""},
      {"markov_rank", "1.5"},
      {"markov_rank", "true"},
      {"markov_head_type", "\"lstm\""},
      {"markov_head_type", "5"},
      {"markov_head_type", "null"},
      {"enable_confidence_head", "\"yes\""},
      {"enable_confidence_head", "null"},
      {"confidence_head_with_markov", "1"},
      {"confidence_head_alpha", "\"high\""},
      {"attention_mode", "\"mqa\""},
      {"projector_type", "\"dflash\""},
  };
  for (const auto& [key, value] : bad) {
    INFO(key << " = " << value);
    CHECK_THAT(error_for(key, value), Contains("dflash_config." + key) && Contains("draft.json"));
  }
  // Rules across keys, and the top-level keys they read.
  CHECK_THAT(error_for("top.vocab_size", ""), Contains("'vocab_size'") && Contains("missing"));
  CHECK_THAT(error_for("top.hidden_size", "0"), Contains("'hidden_size'"));
  CHECK_THAT(error_for("markov_rank", "0"), Contains("confidence_head_with_markov"));
  CHECK_THAT(error_for("top.num_key_value_heads", "4"),
             Contains("num_key_value_heads") && Contains("attention_mode"));
  CHECK_THAT(error_for("top.num_key_value_heads", "3"), Contains("must divide"));
  CHECK_THAT(error_for("top.num_attention_heads", ""), Contains("'num_attention_heads'"));
  CHECK_THAT(error_for("top.dflash_config", "[1]"), Contains("'dflash_config'"));
  CHECK_THAT(error_for("top.initializer_range", "\"small\""), Contains("initializer_range"));
  auto mha = nlohmann::json::parse(edited("attention_mode", "\"mha\""));
  CHECK_THROWS_WITH(parse_dspark_heads_config(mha.dump(), "draft.json"),
                    Contains("num_key_value_heads") && Contains("mha"));
  CHECK_THROWS_AS(parse_dspark_heads_config("{not json", "broken.json"), fsdp::UsageError);
  CHECK_THROWS_WITH(load_dspark_heads_config("/nonexistent/config.json"),
                    Contains("/nonexistent/config.json"));
}

TEST_CASE("dspark heads: SpecForge's parameter names, shapes and initialisation",
          "[model][dspark]") {
  DSparkHeadsConfig c = parse_dspark_heads_config(kConfig);
  using Shapes = std::map<std::string, std::vector<int64_t>>;
  auto shapes = [](DSparkHeads& h) {
    Shapes out;
    for (const auto& p : h->named_parameters()) out[p.key()] = p.value().sizes().vec();
    return out;
  };
  const std::vector<int64_t> w1{40, 6}, w2{40, 6};
  const std::vector<int64_t> conf{1, 22}, one{1};
  DSparkHeads gated(c);
  CHECK(shapes(gated) == Shapes{{"markov_head.markov_w1.weight", w1},
                                {"markov_head.markov_w2.weight", w2},
                                {"markov_head.gate_proj.weight", {6, 22}},
                                {"markov_head.gate_proj.bias", {6}},
                                {"confidence_head.proj.weight", conf},
                                {"confidence_head.proj.bias", one}});
  c.markov_head_type = MarkovHeadType::kRnn;
  c.confidence_head_with_markov = false;
  DSparkHeads rnn(c);
  CHECK(shapes(rnn) == Shapes{{"markov_head.markov_w1.weight", w1},
                              {"markov_head.markov_w2.weight", w2},
                              {"markov_head.joint_proj.weight", {18, 28}},
                              {"markov_head.joint_proj.bias", {18}},
                              {"confidence_head.proj.weight", {1, 16}},
                              {"confidence_head.proj.bias", one}});
  c.markov_head_type = MarkovHeadType::kVanilla;
  c.enable_confidence_head = false;
  DSparkHeads vanilla(c);
  CHECK(shapes(vanilla) ==
        Shapes{{"markov_head.markov_w1.weight", w1}, {"markov_head.markov_w2.weight", w2}});
  c.markov_rank = 0;
  DSparkHeads none(c);
  CHECK(none->named_parameters().size() == 0);

  // HF's post_init: weights N(0, initializer_range), biases zero.
  c.vocab_size = 2000;
  c.markov_rank = 16;
  c.markov_head_type = MarkovHeadType::kGated;
  c.enable_confidence_head = true;
  c.initializer_range = 0.05;
  torch::manual_seed(3);
  DSparkHeads big(c);
  for (const auto& p : big->named_parameters()) {
    INFO(p.key());
    if (p.key().find("bias") != std::string::npos) {
      CHECK(p.value().abs().max().item<double>() == 0.0);
    } else if (p.value().numel() >= 1000) {
      CHECK(p.value().std().item<double>() == Approx(0.05).epsilon(0.1));
      CHECK(std::abs(p.value().mean().item<double>()) < 0.01);
    }
  }
}

TEST_CASE("dspark heads: each Markov variant and the confidence head from their formulas",
          "[model][dspark]") {
  DSparkHeadsConfig c = parse_dspark_heads_config(kConfig);
  const int64_t B = 2, N = 3, bs = 4, H = 16, V = 40, r = 6;
  torch::manual_seed(11);
  const auto f64 = torch::kFloat64;
  const torch::Tensor base = torch::randn({B, N, bs, V}, f64);
  const torch::Tensor hidden = torch::randn({B, N, bs, H}, f64);
  const torch::Tensor prev = torch::randint(0, V, {B, N, bs}, torch::kLong);

  for (auto type : {MarkovHeadType::kVanilla, MarkovHeadType::kGated, MarkovHeadType::kRnn}) {
    INFO(markov_head_type_name(type));
    c.markov_head_type = type;
    DSparkHeads heads(c);
    heads->to(f64);
    torch::NoGradGuard guard;
    for (auto& p : heads->parameters()) p.uniform_(-0.5, 0.5);
    auto& m = *heads->markov_head;
    const torch::Tensor w1 = m.markov_w1->weight, w2 = m.markov_w2->weight;
    torch::Tensor want = torch::empty_like(base);
    // Element by element over (b, j): the formula of each variant, one position at a time.
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < N; ++j) {
        torch::Tensor state = torch::zeros({r}, f64);
        for (int64_t k = 0; k < bs; ++k) {
          const torch::Tensor e = w1[prev[b][j][k].item<int64_t>()];
          const torch::Tensor h = hidden[b][j][k];
          torch::Tensor bias;
          if (type == MarkovHeadType::kVanilla) {
            bias = torch::mv(w2, e);
          } else if (type == MarkovHeadType::kGated) {
            const torch::Tensor g = torch::sigmoid(
                torch::mv(m.gate_proj->weight, torch::cat({h, e})) + m.gate_proj->bias);
            bias = torch::mv(w2, g * e);
          } else {
            const torch::Tensor z =
                torch::mv(m.joint_proj->weight, torch::cat({state, e, h})) + m.joint_proj->bias;
            const torch::Tensor g = torch::sigmoid(z.slice(0, 0, r));
            state = g * state + (1 - g) * torch::tanh(z.slice(0, r, 2 * r));
            bias = torch::mv(w2, torch::tanh(z.slice(0, 2 * r, 3 * r)));
          }
          want[b][j][k] = base[b][j][k] + bias;
        }
      }
    }
    const torch::Tensor got = heads->apply_logits_head(base, prev, hidden);
    CHECK(torch::allclose(got, want, 1e-12, 1e-12));

    // Confidence: proj([hidden, w1(prev)]) with confidence_head_with_markov.
    auto& proj = *heads->confidence_head->proj;
    const torch::Tensor conf_want =
        torch::matmul(torch::cat({hidden, w1.index({prev})}, -1), proj.weight.t()).squeeze(-1) +
        proj.bias;
    const torch::Tensor conf = heads->predict_confidence(hidden, prev);
    CHECK(conf.scalar_type() == f64);
    CHECK(torch::allclose(conf, conf_want, 1e-12, 1e-12));
  }

  // Without a Markov head the logits pass through; without a confidence head there is none.
  c.markov_rank = 0;
  c.confidence_head_with_markov = false;
  DSparkHeads plain(c);
  plain->to(f64);
  CHECK(plain->apply_logits_head(base, prev, hidden).is_same(base));
  c.enable_confidence_head = false;
  DSparkHeads bare(c);
  CHECK_FALSE(bare->predict_confidence(hidden, prev).defined());
  // bf16 states give fp32 confidence logits (SpecForge's .float()).
  c.enable_confidence_head = true;
  DSparkHeads half(c);
  half->to(torch::kBFloat16);
  CHECK(half->predict_confidence(hidden.to(torch::kBFloat16), prev).scalar_type() ==
        torch::kFloat32);
  // Shapes that do not agree are an error, not a broadcast.
  c.markov_rank = 6;
  DSparkHeads vanilla(c);
  vanilla->to(f64);
  CHECK_THROWS_AS(vanilla->apply_logits_head(base, prev.narrow(1, 0, 2), hidden), fsdp::Error);
}
