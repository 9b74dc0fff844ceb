// Block drafts (docs/block-drafts.md): the anchor draw (candidates, the subset, independence of the
// micro-batch and rank), block tokens and labels against hand-worked values, the config's rules
// and SpecForge's default target layers, the chunked objective equal to the unchunked one, and the
// blocks' accepted counts and the engine's walk over replies against hand-worked examples.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <set>

#include "core/error.h"
#include "model/block_acceptance.h"
#include "model/block_targets.h"
#include "model/chunk_reduce.h"
#include "model/dflash_config.h"
#include "model/dflash_objective.h"

using namespace fsdp::model;

namespace {

std::string config_json(const std::string& extra) {
  return R"({"architectures": ["DFlashDraftModel"], "hidden_size": 16, "intermediate_size": 32,
    "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 40, "block_size": 4,
    "num_target_layers": 12)" +
         extra + "}";
}

}  // namespace

TEST_CASE("anchors are the supervised pairs, all of them when few enough") {
  const std::vector<int64_t> mask{0, 1, 1, 1, 0, 1, 1, 0, 1};
  const auto all = draw_anchors(mask.data(), 9, 10, anchor_stream(1, 0, 5));
  CHECK(all == std::vector<int64_t>{1, 2, 5});
  const auto two = draw_anchors(mask.data(), 9, 2, anchor_stream(1, 0, 5));
  REQUIRE(two.size() == 2);
  CHECK(std::is_sorted(two.begin(), two.end()));
  for (int64_t a : two) CHECK(std::set<int64_t>{1, 2, 5}.count(a) == 1);
}

TEST_CASE("the anchor draw is a function of seed, epoch and sample only") {
  std::vector<int64_t> mask(200, 1);
  const auto a = draw_anchors(mask.data(), 200, 16, anchor_stream(7, 2, 31));
  CHECK(a == draw_anchors(mask.data(), 200, 16, anchor_stream(7, 2, 31)));
  CHECK(a != draw_anchors(mask.data(), 200, 16, anchor_stream(7, 2, 32)));
  CHECK(a != draw_anchors(mask.data(), 200, 16, anchor_stream(7, 3, 31)));
  CHECK(a != draw_anchors(mask.data(), 200, 16, anchor_stream(8, 2, 31)));
  // In a micro-batch, a row's blocks do not depend on the other rows (only the padding does).
  const at::Tensor m = torch::ones({2, 200}, torch::kLong);
  m[1].narrow(0, 50, 150).zero_();
  const auto l =
      sample_blocks(m, 16, 4, {anchor_stream(7, 2, 31), anchor_stream(7, 2, 9)}, torch::kCPU);
  REQUIRE(l.anchors.size(1) == 16);
  for (int64_t i = 0; i < 16; ++i)
    CHECK(l.anchors[0][i].item<int64_t>() == a[static_cast<size_t>(i)]);
  CHECK(l.keep[1].sum().item<int64_t>() == 16);  // 49 candidates, 16 drawn
  const auto alone =
      sample_blocks(m.narrow(0, 0, 1), 16, 4, {anchor_stream(7, 2, 31)}, torch::kCPU);
  CHECK(torch::equal(alone.anchors[0], l.anchors[0]));
}

TEST_CASE("a micro-batch without candidates gets one dropped block per row") {
  const auto l = sample_blocks(torch::zeros({2, 6}, torch::kLong), 8, 4,
                               {anchor_stream(1, 0, 0), anchor_stream(1, 0, 1)}, torch::kCPU);
  CHECK(l.num_blocks() == 1);
  CHECK(l.keep.sum().item<int64_t>() == 0);
}

TEST_CASE("block tokens and DFlash labels") {
  const at::Tensor ids = torch::arange(10, 20, torch::kLong).view({1, 10});
  const at::Tensor mask = torch::tensor({0, 1, 1, 1, 1, 1, 0, 1, 1, 1}, torch::kLong).view({1, 10});
  BlockLayout l;
  l.anchors = torch::tensor({1, 7, 0}, torch::kLong).view({1, 3});
  l.keep = torch::tensor({true, true, false}).view({1, 3});
  l.context_len = 10;
  l.block_size = 4;
  const at::Tensor tokens = block_input_ids(ids, l, 99);
  CHECK(torch::equal(
      tokens,
      torch::tensor({11, 99, 99, 99, 17, 99, 99, 99, 99, 99, 99, 99}, torch::kLong).view({1, 12})));
  const BlockLabels lab = dflash_labels(ids, mask, l);
  CHECK(torch::equal(lab.target_ids[0][0], torch::tensor({11, 12, 13, 14}, torch::kLong)));
  CHECK(torch::equal(lab.target_ids[0][1], torch::tensor({17, 18, 19, 19}, torch::kLong)));
  // k = 0 never scores; past the end (position 10) and unsupervised positions weigh 0.
  CHECK(torch::equal(lab.weight[0][0], torch::tensor({0.f, 1.f, 1.f, 1.f})));
  CHECK(torch::equal(lab.weight[0][1], torch::tensor({0.f, 1.f, 1.f, 0.f})));
  CHECK(lab.weight[0][2].sum().item<float>() == 0.f);
}

TEST_CASE("SpecForge's default target layers (Python's round: halves to even)") {
  CHECK(default_target_layer_ids(36, 5) == std::vector<int64_t>{1, 9, 17, 25, 33});
  CHECK(default_target_layer_ids(36, 1) == std::vector<int64_t>{18});
  CHECK(default_target_layer_ids(8, 2) == std::vector<int64_t>{1, 5});
  // 1 + 1 * 4 / 8 = 1.5 -> 2; 1 + 3 * 4 / 8 = 2.5 -> 2; 1 + 5 * 4 / 8 = 3.5 -> 4.
  CHECK(default_target_layer_ids(8, 9)[1] == 2);
  CHECK(default_target_layer_ids(8, 9)[3] == 2);
  CHECK(default_target_layer_ids(8, 9)[5] == 4);
}

TEST_CASE("the block draft config: defaults and errors naming the key") {
  const DFlashConfig c =
      parse_dflash_config(config_json(R"(, "dflash_config": {"mask_token_id": 39})"));
  CHECK(c.head_dim() == 128);  // Qwen3's default, not hidden_size / heads
  CHECK(c.target_layer_ids == default_target_layer_ids(12, 2));
  CHECK(c.require_mask_token() == 39);
  REQUIRE(c.layer_types.size() == 2);
  CHECK((c.layer_types[0] == BlockAttention::kFull && c.layer_types[1] == BlockAttention::kFull));
  CHECK(c.fc_in_features() == 2 * 16);
  const DFlashConfig s = parse_dflash_config(config_json(
      R"(, "use_sliding_window": true, "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"])"));
  CHECK(s.sliding_window == 5);
  CHECK((s.layer_types[0] == BlockAttention::kSliding));
  const auto refused = [](const std::string& extra, const std::string& key) {
    try {
      parse_dflash_config(config_json(extra), "cfg.json");
      FAIL("accepted " << extra);
    } catch (const fsdp::UsageError& e) {
      CHECK_THAT(e.what(), Catch::Contains(key));
      CHECK_THAT(e.what(), Catch::Contains("cfg.json"));
    }
  };
  refused(R"(, "block_size": 1)", "block_size");
  CHECK_THROWS_AS(parse_dflash_config(R"({"architectures": ["DFlashDraftModel"], "hidden_size": 16,
    "intermediate_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2, "vocab_size": 40,
    "block_size": 4, "num_target_layers": 12})"),
                  fsdp::UsageError);
  refused(R"(, "dflash_config": {"mask_token_id": 40})", "mask_token_id");
  refused(R"(, "dflash_config": {"target_layer_ids": [3, 12]})", "target_layer_ids");
  refused(R"(, "layer_types": ["full_attention"])", "layer_types");
  refused(R"(, "layer_types": ["sliding_attention", "full_attention"])", "sliding_window");
  refused(R"(, "tie_word_embeddings": true)", "tie_word_embeddings");
  refused(R"(, "hidden_act": "gelu")", "hidden_act");
  CHECK_THROWS_AS(parse_dflash_config(config_json("")).require_mask_token(), fsdp::UsageError);
}

TEST_CASE("the chunked DFlash objective equals the unchunked one, values and gradients") {
  torch::manual_seed(3);
  const int64_t B = 2, N = 5, bs = 4, H = 8, V = 30;
  const at::Tensor hidden = torch::randn({B, N, bs, H}, torch::kDouble);
  BlockLabels lab;
  lab.target_ids = torch::randint(0, V, {B, N, bs}, torch::kLong);
  lab.weight = (torch::rand({B, N, bs}, torch::kDouble) > 0.3).to(torch::kFloat);
  lab.weight.select(2, 0).zero_();
  const at::Tensor w = torch::randn({V, H}, torch::kDouble);
  for (auto loss : {BlockLoss::kDFlash, BlockLoss::kDPace, BlockLoss::kDPaceContinuationValue}) {
    DFlashObjectiveOptions o;
    o.loss = loss;
    o.decay_gamma = 3.0;
    std::vector<at::Tensor> values, grads;
    for (int64_t chunk : {0, 1, 2, 5}) {
      o.chunk_blocks = chunk;
      const at::Tensor h = hidden.clone().requires_grad_(true);
      const DFlashTerms t = dflash_objective(h, lab, w, o);
      t.loss_num.backward();
      values.push_back(torch::stack({t.loss_num.detach(), t.loss_den, t.correct, t.accuracy_den,
                                     t.accept_num, t.accept_den}));
      grads.push_back(h.grad());
    }
    for (size_t i = 1; i < values.size(); ++i) {
      CHECK(torch::allclose(values[i], values[0], 1e-12, 1e-12));
      CHECK(torch::allclose(grads[i], grads[0], 1e-12, 1e-12));
    }
  }
}

TEST_CASE("chunk_reduce: the gradient of any seed, in the loss's direction or not") {
  // Forward keeps the gradient of loss_weights . terms and backward scales it; a seed in another
  // direction recomputes the chunks. Both equal one pass's graph, for the sliced input and a
  // parameter.
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({3, 7, 4}, torch::kDouble);
  const at::Tensor w0 = torch::randn({4, 5}, torch::kDouble);
  const ChunkTermsFn fn = [](const std::vector<at::Tensor>& s, const std::vector<at::Tensor>& p) {
    const at::Tensor y = at::tanh(at::matmul(s[0], p[0]));
    return std::vector<at::Tensor>{y.pow(2).sum(), (y * s[1]).sum(), y.detach().abs().sum()};
  };
  const at::Tensor other = torch::randn({3, 7, 5}, torch::kDouble);
  const std::vector<double> direction{2.0, -0.5};
  for (const auto& seed : {std::vector<double>{0.6, -0.15, 4.0}, std::vector<double>{1.0, 0, 0},
                           std::vector<double>{0.3, 0.3, 0}}) {
    std::vector<at::Tensor> gx, gw;
    for (int64_t chunk : {0, 2, 3}) {
      const at::Tensor xi = x.clone().requires_grad_(true);
      const at::Tensor wi = w0.clone().requires_grad_(true);
      const at::Tensor t = chunk_reduce(fn, {xi, other}, {wi}, chunk, 1, direction);
      (t * torch::tensor(seed, torch::kDouble)).sum().backward();
      gx.push_back(xi.grad());
      gw.push_back(wi.grad());
    }
    for (size_t i = 1; i < gx.size(); ++i) {
      CHECK(torch::allclose(gx[i], gx[0], 1e-12, 1e-13));
      CHECK(torch::allclose(gw[i], gw[0], 1e-12, 1e-13));
    }
  }
}

TEST_CASE("a block's accepted count is the leading run of right, valid proposals from `first`") {
  // Three blocks of 4. Block 0: right at 0, 1, 3, wrong at 2. Block 1: wrong at 0 only. Block 2:
  // all right, but position 3 not valid (past the reply).
  const at::Tensor target = torch::tensor({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}).view({1, 3, 4});
  const at::Tensor pred = torch::tensor({1, 2, 9, 4, 9, 2, 3, 4, 1, 2, 3, 4}).view({1, 3, 4});
  at::Tensor valid = torch::ones({1, 3, 4}, torch::kBool);
  valid[0][2][3] = false;
  // DSpark's proposals start at position 0, DFlash's at 1 (position 0 is the anchor).
  CHECK(torch::equal(accepted_prefix(pred, target, valid, 0),
                     torch::tensor({2, 0, 3}, torch::kLong).view({1, 3})));
  CHECK(torch::equal(accepted_prefix(pred, target, valid, 1),
                     torch::tensor({1, 3, 2}, torch::kLong).view({1, 3})));
}

TEST_CASE(
    "the engine's walk drafts each reply from its first token, jumping past what it accepts") {
  // One row, S = 12: a prompt (0..2), a reply at 3..8, a prompt token at 9, a reply at 10..11.
  // Blocks at every candidate (p and p + 1 supervised: 3..7 and 10) with hand-set accepted
  // counts. Reply 1: draft at 3 accepts 2 -> next at 6, accepts 0 -> next at 7, accepts 1 -> 9
  // (past e = 8: stop): 3 drafts, 3 accepted. Reply 2: draft at 10 accepts 1: 1 draft.
  const at::Tensor mask = torch::tensor({0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1}).view({1, 12});
  BlockLayout layout;
  layout.anchors = torch::tensor({3, 4, 5, 6, 7, 10}, torch::kLong).view({1, 6});
  layout.keep = torch::ones({1, 6}, torch::kBool);
  layout.block_size = 4;
  const at::Tensor accepted = torch::tensor({2, 3, 3, 0, 1, 1}, torch::kLong).view({1, 6});
  EngineWalk w = engine_walk(mask, layout, accepted);
  CHECK(w.drafts == 4);
  CHECK(w.accepted == 4);
  CHECK(w.rows_walked == 1);
  CHECK(w.rows_incomplete == 0);
  // The walk reaches anchor 6; without its block the row is not walked (and adds nothing).
  layout.keep = torch::tensor({true, true, true, false, true, true}).view({1, 6});
  w = engine_walk(mask, layout, accepted);
  CHECK(w.drafts == 0);
  CHECK(w.rows_incomplete == 1);
  // A block the walk skips (anchor 4) may be missing: the row is still walked.
  layout.keep = torch::tensor({true, false, true, true, true, true}).view({1, 6});
  w = engine_walk(mask, layout, accepted);
  CHECK(w.drafts == 4);
  CHECK(w.rows_walked == 1);
}
