// P-EAGLE (docs/model.md "P-EAGLE"): the config's rules, the depth sampling's invariants (depth 0
// every position, each kept row's previous depth kept, the kept counts of the formula, the same
// rows from the same generator state), the engine walk of parallel drafting against hand-worked
// replies, the chunked head equal to one chunk, and the export names. The step itself is checked
// against SpecForge's own code by e2e.specforge_peagle.
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "model/peagle_acceptance.h"
#include "model/peagle_config.h"
#include "model/peagle_model.h"
#include "model/peagle_sampling.h"
#include "model/peagle_step.h"

using namespace fsdp::model;

namespace {

std::string config_json(const std::string& extra) {
  return R"({"architectures": ["PEagleDraftModel"], "hidden_size": 16, "intermediate_size": 24,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 40, "draft_vocab_size": 20,
    "target_hidden_size": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 64)" +
         extra + "}";
}

at::Generator gen(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

}  // namespace

TEST_CASE("peagle: config keys, the mask token, refusals", "[model][peagle]") {
  const PEagleConfig c = parse_peagle_config(config_json(R"(, "mask_token_id": 39)"), "p.json");
  CHECK(c.mask_token_id == 39);
  CHECK(c.core.hidden_size == 16);
  CHECK(parse_peagle_config(config_json(R"(, "dflash_config": {"mask_token_id": 7})"), "p.json")
            .mask_token_id == 7);
  CHECK_FALSE(parse_peagle_config(config_json(""), "p.json").mask_token_id.has_value());
  const std::string out = c.to_json();
  CHECK(out.find("PEagleDraftModel") != std::string::npos);
  CHECK(out.find("\"mask_token_id\": 39") != std::string::npos);
  CHECK(parse_peagle_config(out, "back.json").mask_token_id == 39);
  auto refused = [&](const std::string& text, const std::string& key) {
    INFO(text);
    try {
      parse_peagle_config(text, "p.json");
      FAIL("accepted");
    } catch (const fsdp::UsageError& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
    }
  };
  refused(config_json(R"(, "mask_token_id": 40)"), "mask_token_id");
  refused(config_json(R"(, "mask_token_id": 3, "dflash_config": {"mask_token_id": 4})"),
          "mask_token_id");
  refused(config_json(R"(, "fc_norm": true)"), "fc_norm");
  refused(config_json(R"(, "norm_output": true)"), "norm_output");
  refused(config_json(R"(, "model_type": "qwen3")"), "model_type");
  std::string eagle3 = config_json("");
  eagle3.replace(eagle3.find("PEagleDraftModel"), 16, "LlamaForCausalLMEagle3");
  refused(eagle3, "architectures");
}

TEST_CASE("peagle: depth sampling keeps SpecForge's counts and chains", "[model][peagle]") {
  // 40 positions, 30 valid, loss positions 8..27.
  std::vector<int64_t> mask(40, 0);
  for (int64_t p = 8; p < 28; ++p) mask[static_cast<size_t>(p)] = 1;
  CodOptions o;
  o.num_depths = 8;
  o.down_sample_ratio = 0.7;
  o.down_sample_ratio_min = 0.2;
  const CodRows r = cod_sample(mask, 30, o, gen(11));
  REQUIRE(r.depths() >= 2);
  CHECK(r.anchors[0].size() == 40);  // depth 0: every position, padding included
  const int64_t n = 20;
  for (int64_t d = 1; d < r.depths(); ++d) {
    INFO("depth " << d);
    const auto& cur = r.anchors[static_cast<size_t>(d)];
    const std::set<int64_t> prev(r.anchors[static_cast<size_t>(d - 1)].begin(),
                                 r.anchors[static_cast<size_t>(d - 1)].end());
    CHECK(std::is_sorted(cur.begin(), cur.end()));
    // At most the formula's count; a kept (a, d) has (a, d-1) kept and a + d a loss position.
    CHECK(static_cast<int64_t>(cur.size()) <=
          static_cast<int64_t>((n - d) * std::max(std::pow(0.7, d), 0.2)));
    for (int64_t a : cur) {
      CHECK(prev.count(a) == 1);
      CHECK(mask[static_cast<size_t>(a + d)] == 1);
    }
  }
  // Depth 1 draws from 20 eligible loss positions (p >= 1 in the sample): int(19 * 0.7) = 13.
  CHECK(r.anchors[1].size() == 13);
  CHECK(r.randperm_sizes.at(0) == 20);
  // The same generator state draws the same rows; another seed other rows.
  CHECK(cod_sample(mask, 30, o, gen(11)).anchors == r.anchors);
  CHECK(cod_sample(mask, 30, o, gen(12)).anchors != r.anchors);
  // No loss position: depth 0 only.
  CHECK(cod_sample(std::vector<int64_t>(10, 0), 10, o, gen(1)).depths() == 1);
}

TEST_CASE("peagle: the engine walk of parallel drafting", "[model][peagle]") {
  // One sample, S = 10, the reply at positions 3..8 (a = 3, e = 8), K = 3 depths.
  at::Tensor mask = torch::zeros({1, 10}, torch::kLong);
  mask.narrow(1, 3, 6).fill_(1);
  at::Tensor hits = torch::zeros({1, 3, 10}, torch::kLong);
  // First draft at anchor 2 proposes x_4, x_5, x_6: depths 0 and 1 hit, depth 2 misses -> 2.
  hits[0][0][2] = 1;
  hits[0][1][2] = 1;
  // Next draft at 2 + 2 + 1 = 5 proposes x_7, x_8 (x_9 is past the reply): both hit -> 2.
  hits[0][0][5] = 1;
  hits[0][1][5] = 1;
  hits[0][2][5] = 1;  // would propose x_9, past the reply: not counted
  // Next draft would be at 8: 8 + 2 > e, none.
  PEagleWalk w = peagle_engine_walk(mask, hits);
  CHECK(w.drafts == 2);
  CHECK(w.accepted == 4);
  // A miss at depth 0 accepts nothing and moves one token on.
  hits.zero_();
  w = peagle_engine_walk(mask, hits);
  CHECK(w.drafts == 5);  // anchors 2, 3, 4, 5, 6 (p + 2 <= 8)
  CHECK(w.accepted == 0);
  // A reply at the sample's start drafts from anchor 0.
  at::Tensor m0 = torch::zeros({1, 4}, torch::kLong);
  m0.narrow(1, 0, 3).fill_(1);
  at::Tensor h0 = torch::ones({1, 2, 4}, torch::kLong);
  w = peagle_engine_walk(m0, h0);
  CHECK(w.drafts == 1);
  CHECK(w.accepted == 1);  // anchor 0 proposes x_2 only (x_3 is past e = 2)
}

TEST_CASE("peagle: the chunked head equals one chunk; export names", "[model][peagle]") {
  PEagleConfig c = parse_peagle_config(
      config_json(R"(, "mask_token_id": 39, "num_hidden_layers": 2)"), "p.json");
  torch::manual_seed(3);
  PEagleDraft draft(c);
  draft->to(torch::kDouble);
  const at::Tensor t2d = torch::arange(40, torch::kLong).lt(20);
  draft->set_vocab_mapping(torch::zeros({20}, torch::kLong), t2d);
  const TargetHead head(torch::randn({40, 8}, torch::kDouble), t2d);
  PEagleInputs in;
  in.input_ids = torch::randint(0, 40, {2, 12}, torch::kLong);
  in.attention_mask = torch::ones({2, 12}, torch::kLong);
  in.attention_mask[1].narrow(0, 9, 3).zero_();
  in.loss_mask = in.attention_mask.clone();
  in.loss_mask.narrow(1, 0, 3).zero_();
  in.host_loss_mask = in.loss_mask;
  in.aux_hidden = torch::randn({2, 12, 24}, torch::kDouble);
  in.target_hidden = torch::randn({2, 12, 8}, torch::kDouble);
  const std::vector<CodRows> rows{dense_rows(12, 3), dense_rows(12, 3)};
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<double> losses;
  for (int64_t chunk : {100000, 5}) {
    draft->zero_grad();
    PEagleStepOptions o;
    o.mask_token_id = 39;
    o.head_chunk_rows = chunk;
    const PEagleStepOutput out = peagle_step(*draft, head, in, rows, 3, o);
    out.loss.backward();
    losses.push_back(out.loss.item<double>());
    std::vector<at::Tensor> g;
    for (const auto& p : draft->trainable_parameters()) g.push_back(p.grad().clone());
    grads.push_back(g);
    CHECK(out.depth_total.sum().item<double>() > 0);
  }
  CHECK(std::abs(losses[0] - losses[1]) <= 1e-12 * std::abs(losses[0]));
  for (size_t k = 0; k < grads[0].size(); ++k) {
    INFO("parameter " << k);
    CHECK((grads[0][k] - grads[1][k]).abs().max().item<double>() <=
          1e-12 * std::max(1.0, grads[0][k].abs().max().item<double>()));
  }
  CHECK(PEagleDraftImpl::export_name("mask_hidden.weight") == "mask_hidden");
  CHECK(PEagleDraftImpl::export_name("midlayer.mlp.up_proj.weight") ==
        "layers.0.mlp.up_proj.weight");
  CHECK(PEagleDraftImpl::export_name("layers.1.norm.weight") == "layers.1.norm.weight");
  // The units: mask_hidden after the embedding, before fc.
  const auto units = draft->unit_names();
  REQUIRE(units.size() >= 3);
  CHECK(units[0] == "embed_tokens");
  CHECK(units[1] == "mask_hidden");
}
