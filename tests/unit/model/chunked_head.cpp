// The chunked draft head and loss (docs/model.md "Chunked head and loss"): equal to the unchunked
// path within 1e-6 in fp32 (loss, every step's loss, the acceptance sums and every parameter's
// gradient) with the same counted metrics (hits, chains, drafts) bit for bit, at T = 1, 3, 7 with
// GQA and padding, for every objective, with chunk sizes of 1 row, sizes that do not divide the
// rows and sizes past them; the head units' uses as the hooks see them; evaluation without a graph;
// the automatic rule.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/draft_model.h"
#include "model/memory_estimate.h"
#include "model/ttt_loss.h"
#include "support/random_draft.h"
#include "support/small_draft.h"

using namespace fsdp::model;

namespace {

DraftConfig config(bool norm_output = false) {
  DraftConfig c = fsdp::testing::small_draft();  // 4 heads over 2 KV heads: GQA
  c.max_position_embeddings = 32;
  c.norm_output = norm_output;
  c.validate();
  return c;
}

// Two samples of 11 positions: the second padded after 8 tokens, prompts and a gap out of the
// loss, a target distribution with its own zeros of the position mask.
struct Batch {
  at::Tensor ids, mask, loss_mask, aux;
  TargetDistribution target;
};

Batch make_batch(const DraftConfig& c, int64_t T) {
  const int64_t B = 2, S = 11;
  Batch b;
  b.ids = torch::randint(0, c.vocab_size, {B, S}, torch::kLong);
  b.mask = torch::ones({B, S}, torch::kLong);
  b.mask[1].narrow(0, 8, 3).zero_();
  b.loss_mask = b.mask.clone();
  b.loss_mask[0].narrow(0, 0, 3).zero_();
  b.loss_mask[1][5] = 0;
  b.aux = torch::randn({B, S, c.fc_in_features()}) * 2;
  b.target.target_p = (torch::randn({B, S + T, c.draft_vocab()}) * 2).softmax(-1);
  b.target.position_mask = b.loss_mask * torch::rand({B, S}).gt(0.2).to(torch::kLong);
  b.target.draft_mass = torch::rand({B, S}) * 0.5 + 0.5;
  return b;
}

struct Run {
  StepOutput out;
  std::vector<at::Tensor> grads;
};

Run run(Eagle3Draft& m, const Batch& b, const LossOptions& o) {
  m->zero_grad();
  Run r;
  r.out = ttt_step(*m, b.target, b.ids, b.mask, b.loss_mask, b.aux, o);
  r.out.loss.backward();
  for (const auto& p : m->trainable_parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The counted metrics bit for bit; the loss, the acceptance sums and the gradients within 1e-6
// (relative to the largest entry where that exceeds 1).
void check_same(const Run& got, const Run& want) {
  const StepOutput &g = got.out, &w = want.out;
  CHECK(max_diff(g.loss, w.loss) <= 1e-6);
  CHECK(max_diff(g.ploss, w.ploss) <= 1e-6);
  for (auto [name, a, b] : {std::tuple<const char*, at::Tensor, at::Tensor>{"acc", g.acc, w.acc},
                            {"correct", g.correct, w.correct},
                            {"loss_tokens", g.loss_tokens, w.loss_tokens},
                            {"position_tokens", g.position_tokens, w.position_tokens},
                            {"accepted", g.accepted, w.accepted},
                            {"anchors", g.anchors, w.anchors},
                            {"chain_hits", g.chain_hits, w.chain_hits},
                            {"draft_accepted", g.draft_accepted, w.draft_accepted},
                            {"drafts", g.drafts, w.drafts},
                            {"valid_tokens", g.valid_tokens, w.valid_tokens}}) {
    INFO(name);
    CHECK(torch::equal(a, b));
  }
  // A sum of softmax terms: the logits of a chunk's matmul may round differently from the whole
  // step's (the GEMM's blocking depends on the row count), so this float agrees within rounding.
  CHECK(max_diff(g.accept_rate, w.accept_rate) <=
        1e-6 * std::max(1.0, w.accept_rate.abs().max().item<double>()));
  CHECK(max_diff(g.accept_rate_renorm, w.accept_rate_renorm) <=
        1e-6 * std::max(1.0, w.accept_rate_renorm.abs().max().item<double>()));
  REQUIRE(got.grads.size() == want.grads.size());
  for (size_t k = 0; k < got.grads.size(); ++k) {
    INFO("parameter " << k);
    const double scale = std::max(1.0, want.grads[k].abs().max().item<double>());
    CHECK(max_diff(got.grads[k], want.grads[k]) <= 1e-6 * scale);
  }
}

struct Objective {
  const char* name;
  LossOptions options;
};

std::vector<Objective> objectives(int64_t T) {
  LossOptions base;
  base.ttt_length = T;
  std::vector<Objective> out{{"soft_ce", base}};
  LossOptions mix = base;
  mix.loss_terms = parse_loss_spec(
      R"({"kl_div": 0.4, "tv": 0.2, "jsd": 0.2, "rkl": 0.1, "nla": 0.1, "ce": 0.1, "lk_hybrid": 0.1})");
  out.push_back({"mix of every term", mix});
  LossOptions lambda = base;
  lambda.lk = LossOptions::LK::kLambda;
  lambda.kl_scale = 0.7;
  lambda.kl_decay = 1.3;
  out.push_back({"LK lambda", lambda});
  LossOptions alpha = base;
  alpha.lk = LossOptions::LK::kAlpha;
  alpha.normalization = LossNormalization::kValidTokens;
  out.push_back({"LK alpha, per-token normalisation", alpha});
  return out;
}

}  // namespace

TEST_CASE("chunked head: equal to the unchunked path at T = 1, 3, 7 for every objective",
          "[model][chunked]") {
  const DraftConfig c = config();
  torch::manual_seed(21);
  Eagle3Draft m(c);
  fsdp::testing::randomise_draft(m);
  for (int64_t T : {1, 3, 7}) {
    const Batch b = make_batch(c, T);
    // 15 loss rows: chunks of 1, of sizes that leave a remainder, one chunk, more than the rows.
    REQUIRE(b.loss_mask.sum().item<int64_t>() == 15);
    for (const Objective& obj : objectives(T)) {
      LossOptions off = obj.options;
      off.head_chunk_rows = -1;
      const Run want = run(m, b, off);
      for (int64_t chunk : {1, 4, 7, 15, 1000}) {
        INFO("T " << T << ", " << obj.name << ", chunks of " << chunk);
        LossOptions on = obj.options;
        on.head_chunk_rows = chunk;
        check_same(run(m, b, on), want);
      }
    }
  }
}

TEST_CASE("chunked head: norm_output, recompute_loss, frozen head weights, the target head",
          "[model][chunked]") {
  const int64_t T = 3;
  SECTION("norm_output: the head is lm_head alone") {
    const DraftConfig c = config(/*norm_output=*/true);
    torch::manual_seed(22);
    Eagle3Draft m(c);
    fsdp::testing::randomise_draft(m);
    const Batch b = make_batch(c, T);
    LossOptions o;
    o.ttt_length = T;
    o.head_chunk_rows = -1;
    const Run want = run(m, b, o);
    o.head_chunk_rows = 4;
    check_same(run(m, b, o), want);
    // recompute_loss changes nothing once chunked (the chunks recompute everything).
    o.recompute_loss = true;
    check_same(run(m, b, o), want);
  }
  SECTION("LoRA: norm and lm_head frozen, only the hidden rows need a gradient") {
    const DraftConfig c = config();
    torch::manual_seed(23);
    Eagle3Draft m(c);
    fsdp::testing::randomise_draft(m);
    m->enable_lora(2, 4.0, {LoraTarget::kQProj, LoraTarget::kDownProj});
    {
      torch::NoGradGuard g;
      for (const auto& kv : m->named_parameters())
        if (is_lora_tensor(kv.key())) kv.value().uniform_(-0.3, 0.3);
    }
    const Batch b = make_batch(c, T);
    LossOptions o;
    o.ttt_length = T;
    o.head_chunk_rows = -1;
    const Run want = run(m, b, o);
    o.head_chunk_rows = 5;
    check_same(run(m, b, o), want);
  }
  SECTION("the trainer's path: target head, loss rows built from the host mask, LK") {
    const DraftConfig c = config();
    torch::manual_seed(24);
    Eagle3Draft m(c);
    fsdp::testing::randomise_draft(m);
    const Batch b = make_batch(c, T);
    TargetHead head(torch::randn({c.vocab_size, c.target_hidden()}), m->t2d);
    const at::Tensor target_hidden = torch::randn({2, 11, c.target_hidden()});
    LossOptions o;
    o.ttt_length = T;
    o.lk = LossOptions::LK::kLambda;
    auto step = [&](int64_t chunk) {
      o.head_chunk_rows = chunk;
      m->zero_grad();
      Run r;
      r.out = ttt_step(*m, head, b.ids, b.mask, b.loss_mask, b.aux, target_hidden, o);
      r.out.loss.backward();
      for (const auto& p : m->trainable_parameters()) r.grads.push_back(p.grad().clone());
      return r;
    };
    const Run want = step(-1);
    check_same(step(2), want);
  }
}

TEST_CASE("chunked head: one use of norm and lm_head per call, evaluation keeps no graph",
          "[model][chunked]") {
  const DraftConfig c = config();
  torch::manual_seed(25);
  Eagle3Draft m(c);
  fsdp::testing::randomise_draft(m);
  const int64_t T = 3;
  const Batch b = make_batch(c, T);
  struct Recorder : fsdp::UnitHooks {
    std::vector<std::string> pre, post;
    void pre_forward(const std::string& unit) override { pre.push_back(unit); }
    void post_forward(const std::string& unit, const at::Tensor& out) override {
      post.push_back(unit + (out.defined() && out.requires_grad() ? "+grad" : ""));
    }
  };
  std::vector<Recorder> seen(2);
  for (int chunked = 0; chunked < 2; ++chunked) {
    LossOptions o;
    o.ttt_length = T;
    o.head_chunk_rows = chunked ? 3 : -1;
    m->set_unit_hooks(&seen[static_cast<size_t>(chunked)]);
    ttt_step(*m, b.target, b.ids, b.mask, b.loss_mask, b.aux, o);
    m->set_unit_hooks(nullptr);
  }
  // The same units entered in the same order: T + 1 uses of each head unit (the pre rows' at
  // step 0), whatever the number of chunks.
  CHECK(seen[1].pre == seen[0].pre);
  CHECK(std::count(seen[1].pre.begin(), seen[1].pre.end(), "lm_head") == T + 1);
  CHECK(std::count(seen[1].pre.begin(), seen[1].pre.end(), "norm") == T + 1);
  // Chunked, lm_head's use is inside the norm's; the step's values carry the backward hooks, the
  // pre rows (argmax only) have no output.
  const std::vector<std::string> head_step{"lm_head+grad", "norm+grad"};
  const std::vector<std::string> pre_rows{"lm_head", "norm"};
  auto at = [&](size_t k) {
    return std::vector<std::string>(seen[1].post.begin() + k, seen[1].post.begin() + k + 2);
  };
  // fc, then embed_tokens, midlayer and the head per step.
  CHECK(at(3) == head_step);
  CHECK(at(5) == pre_rows);
  CHECK(at(9) == head_step);

  // Evaluation (no grad): the same numbers, no graph.
  LossOptions o;
  o.ttt_length = T;
  o.head_chunk_rows = -1;
  torch::NoGradGuard g;
  const StepOutput want = ttt_step(*m, b.target, b.ids, b.mask, b.loss_mask, b.aux, o);
  o.head_chunk_rows = 4;
  const StepOutput got = ttt_step(*m, b.target, b.ids, b.mask, b.loss_mask, b.aux, o);
  CHECK_FALSE(got.loss.requires_grad());
  CHECK(max_diff(got.loss, want.loss) <= 1e-6);
  CHECK(torch::equal(got.correct, want.correct));
  CHECK(max_diff(got.accept_rate, want.accept_rate) <= 1e-5);
  CHECK(torch::equal(got.chain_hits, want.chain_hits));
}

TEST_CASE("chunked head: the automatic rule", "[model][chunked]") {
  // Off and explicit sizes pass through; automatic chunks only long steps.
  CHECK(head_chunk_rows(-1, 1 << 20, 32000) == 0);
  CHECK(head_chunk_rows(7, 3, 32000) == 7);
  CHECK(head_chunk_rows(0, 4192, 32000) == 0);
  CHECK(head_chunk_rows(0, 4193, 32000) == 1048);
  CHECK(head_chunk_rows(0, 2048, 32000) == 0);
  CHECK(head_chunk_rows(0, 1 << 20, 151936) == 220);
  CHECK(head_chunk_rows(0, 1 << 30, 1 << 26) == 1);
  // The tests' small draft never chunks by itself.
  CHECK(head_chunk_rows(0, 14, 20) == 0);
}
