// DSpark's objective: block labels, previous tokens, loss weights and aligned target states on a
// hand-worked example; every term against its definition written with plain tensor operations;
// the chunked path (its own backward) against the unchunked autograd graph and against finite
// differences in float64; the blocks' accepted counts; the loss's combination and the errors.
// SpecForge itself is the reference of tests/e2e/specforge_dspark.sh.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/dspark_heads.h"
#include "model/dspark_objective.h"

using namespace fsdp::model;
using Catch::Matchers::Contains;

namespace {

const auto kF64 = torch::kFloat64;

torch::Tensor longs(std::vector<int64_t> v, std::vector<int64_t> shape) {
  return torch::tensor(v, torch::kLong).reshape(shape);
}

DSparkHeadsConfig heads_config(int64_t rank, MarkovHeadType type, bool confidence,
                               bool with_markov) {
  DSparkHeadsConfig c;
  c.vocab_size = 24;
  c.hidden_size = 8;
  c.markov_rank = rank;
  c.markov_head_type = type;
  c.enable_confidence_head = confidence;
  c.confidence_head_with_markov = with_markov;
  return c;
}

// Random float64 inputs for B x N blocks of bs positions, with a cumulative eval mask.
DSparkObjectiveInputs random_inputs(int64_t B, int64_t N, int64_t bs, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t H = 8, V = 24;
  DSparkObjectiveInputs in;
  in.hidden4d = torch::randn({B, N, bs, H}, kF64).requires_grad_(true);
  in.target_ids = torch::randint(0, V, {B, N, bs}, torch::kLong);
  in.prev_token_ids = torch::randint(0, V, {B, N, bs}, torch::kLong);
  in.eval_mask = (torch::rand({B, N, bs}) < 0.85).to(torch::kInt).cumprod(-1).to(torch::kBool);
  in.loss_weights = dspark_loss_weights(in.eval_mask, 2.0);
  in.aligned_target_hidden = torch::randn({B, N, bs, H}, kF64);
  in.lm_head_weight = torch::randn({V, H}, kF64) * 0.5;
  return in;
}

DSparkHeads make_heads(const DSparkHeadsConfig& c, uint64_t seed) {
  DSparkHeads heads(c);
  heads->to(kF64);
  torch::manual_seed(seed);
  torch::NoGradGuard guard;
  for (auto& p : heads->parameters()) p.uniform_(-0.6, 0.6);
  return heads;
}

std::vector<torch::Tensor> values(const DSparkTerms& t) {
  return {t.ce_num,           t.l1_num,
          t.confidence_num,   t.confidence_error_num,
          t.correct_num,      t.eval_den,
          t.ce_position_num,  t.correct_position_num,
          t.position_den,     t.teacher_agreement_num,
          t.teacher_top1_num, t.draft_top1_num,
          t.tau_num,          t.tau_den};
}

// The loss's gradients: hidden4d's, then every head parameter's (zeros where none arrives).
std::vector<torch::Tensor> gradients(DSparkHeads& heads, const DSparkObjectiveInputs& in,
                                     const DSparkAlphas& a, int64_t chunk) {
  heads->zero_grad();
  in.hidden4d.mutable_grad() = torch::Tensor();
  const DSparkTerms t = dspark_objective(heads, in, a, chunk);
  dspark_loss(t, a, in.loss_weights.sum()).backward();
  std::vector<torch::Tensor> out{in.hidden4d.grad().clone()};
  for (auto& p : heads->parameters())
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}

}  // namespace

TEST_CASE("dspark labels: a hand-worked batch", "[model][dspark]") {
  // S = 6; blocks of 3 at anchors 1 and 3, a third block dropped (its anchor 0).
  const torch::Tensor ids = longs({10, 11, 12, 13, 14, 15}, {1, 6});
  const torch::Tensor loss_mask = longs({0, 1, 1, 1, 0, 1}, {1, 6});
  const torch::Tensor anchors = longs({1, 3, 0}, {1, 3});
  const torch::Tensor keep = torch::tensor({true, true, false}).reshape({1, 3});
  const DSparkBlockLabels l = dspark_block_labels(ids, loss_mask, anchors, keep, 3);
  // Block 0 predicts 2, 3, 4 (4 unsupervised); block 1 predicts 4, 5 and 6 (past the end,
  // clamped to 5), its first label unsupervised, so nothing after it is scored either.
  CHECK(torch::equal(l.target_ids, longs({12, 13, 14, 14, 15, 15, 10, 10, 10}, {1, 3, 3})));
  CHECK(torch::equal(l.safe_label_indices, longs({2, 3, 4, 4, 5, 5, 0, 0, 0}, {1, 3, 3})));
  CHECK(torch::equal(l.eval_mask.to(torch::kLong), longs({1, 1, 0, 0, 0, 0, 0, 0, 0}, {1, 3, 3})));
  CHECK(torch::equal(dspark_prev_token_ids(ids, anchors, l.target_ids),
                     longs({11, 12, 13, 13, 14, 15, 10, 10, 10}, {1, 3, 3})));

  // The target state before each label: positions max(label - 1, 0).
  const torch::Tensor states = torch::arange(6, kF64).view({1, 6, 1}).expand({1, 6, 2});
  const torch::Tensor aligned = dspark_aligned_target_hidden(states, l.safe_label_indices);
  CHECK(aligned.sizes() == torch::IntArrayRef{1, 3, 3, 2});
  CHECK(torch::equal(aligned.select(-1, 1),
                     torch::tensor({1., 2., 3., 3., 4., 4., 0., 0., 0.}, kF64).view({1, 3, 3})));

  // Loss weights: exp(-k / gamma) from k = 0 on the scored positions.
  const torch::Tensor eval = torch::tensor({true, true, true, false}).view({1, 1, 4});
  const torch::Tensor w = dspark_loss_weights(eval, 2.0);
  CHECK(w.scalar_type() == torch::kFloat32);
  CHECK(torch::allclose(
      w,
      torch::tensor({1.0, std::exp(-0.5), std::exp(-1.0), 0.0}, torch::kFloat32).view({1, 1, 4})));
  for (auto none : {std::optional<double>(), std::optional<double>(0.0)})
    CHECK(torch::equal(dspark_loss_weights(eval, none), eval.to(torch::kFloat32)));
}

TEST_CASE("dspark objective: each term against its definition", "[model][dspark]") {
  DSparkHeads heads = make_heads(heads_config(4, MarkovHeadType::kVanilla, true, false), 5);
  const DSparkObjectiveInputs in = random_inputs(2, 3, 4, 6);
  const DSparkAlphas alphas{0.3, 0.5, 0.7};
  const DSparkTerms t = dspark_objective(heads, in, alphas, 0);
  REQUIRE(t.has_target);

  torch::NoGradGuard guard;
  const torch::Tensor h = in.hidden4d.detach();
  const torch::Tensor& W = in.lm_head_weight;
  auto& m = *heads->markov_head;
  const torch::Tensor z =
      torch::matmul(h, W.t()) +
      torch::matmul(m.markov_w1->weight.index({in.prev_token_ids}), m.markov_w2->weight.t());
  const torch::Tensor zt = torch::matmul(in.aligned_target_hidden, W.t());
  const torch::Tensor w = in.loss_weights.to(kF64), e = in.eval_mask.to(kF64);
  const torch::Tensor ce =
      torch::logsumexp(z, -1) - z.gather(-1, in.target_ids.unsqueeze(-1)).squeeze(-1);
  const torch::Tensor q = torch::softmax(z, -1), p = torch::softmax(zt, -1);
  const torch::Tensor l1 = (q - p).abs().sum(-1);
  const torch::Tensor accept = (1 - l1 / 2).clamp(0, 1);
  auto& proj = *heads->confidence_head->proj;
  const torch::Tensor x = (torch::matmul(h, proj.weight.t()) + proj.bias).squeeze(-1);
  // BCE with logits, the numerically stable form.
  const torch::Tensor bce = x.clamp_min(0) - x * accept + torch::log1p(torch::exp(-x.abs()));
  const torch::Tensor correct = (z.argmax(-1) == in.target_ids).to(kF64) * e;

  CHECK(t.ce_num.item<double>() == Approx((ce * w).sum().item<double>()).epsilon(1e-12));
  CHECK(t.l1_num.item<double>() == Approx((l1 * w).sum().item<double>()).epsilon(1e-12));
  CHECK(t.confidence_num.item<double>() == Approx((bce * w).sum().item<double>()).epsilon(1e-12));
  CHECK(t.confidence_error_num.item<double>() ==
        Approx(((torch::sigmoid(x) - accept).abs() * w).sum().item<double>()).epsilon(1e-12));
  CHECK(t.correct_num.item<double>() == correct.sum().item<double>());
  CHECK(t.eval_den.item<double>() == e.sum().item<double>());
  CHECK(torch::allclose(t.ce_position_num.to(kF64), (ce * e).sum(torch::IntArrayRef{0, 1}), 1e-12));
  CHECK(torch::equal(t.position_den.to(kF64), e.sum(torch::IntArrayRef{0, 1})));
  CHECK(t.teacher_agreement_num.item<double>() ==
        ((z.argmax(-1) == zt.argmax(-1)).to(kF64) * e).sum().item<double>());
  CHECK(t.teacher_top1_num.item<double>() ==
        Approx((std::get<0>(p.max(-1)) * e).sum().item<double>()).epsilon(1e-12));
  CHECK(t.draft_top1_num.item<double>() ==
        Approx((std::get<0>(q.max(-1)) * e).sum().item<double>()).epsilon(1e-12));
  // tau: per block with a scored position, 1 + sum_k prod_{i <= k} accept_i over scored i.
  double tau = 0, blocks = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < 3; ++j) {
      if (e[b][j].sum().item<double>() == 0) continue;
      double run = 1, sum = 1;
      for (int64_t k = 0; k < 4; ++k) {
        run *= accept[b][j][k].item<double>() * e[b][j][k].item<double>();
        sum += run;
      }
      tau += sum;
      blocks += 1;
    }
  }
  CHECK(t.tau_num.item<double>() == Approx(tau).epsilon(1e-12));
  CHECK(t.tau_den.item<double>() == blocks);

  // The loss: the weighted terms over the normaliser, times the caller's scale.
  const torch::Tensor den = torch::tensor(7.5, kF64);
  const double want = 2 *
                      (0.3 * t.ce_num.item<double>() + 0.5 * t.l1_num.item<double>() +
                       0.7 * t.confidence_num.item<double>()) /
                      7.5;
  CHECK(dspark_loss(t, alphas, den, 2.0).item<double>() == Approx(want).epsilon(1e-14));
}

TEST_CASE("dspark objective: chunks equal one pass, values and gradients", "[model][dspark]") {
  const DSparkAlphas alphas{0.1, 0.9, 1.0};
  for (auto type : {MarkovHeadType::kVanilla, MarkovHeadType::kGated, MarkovHeadType::kRnn}) {
    INFO(markov_head_type_name(type));
    DSparkHeads heads = make_heads(heads_config(4, type, true, true), 7);
    const DSparkObjectiveInputs in = random_inputs(2, 5, 4, 8);
    const DSparkTerms one = dspark_objective(heads, in, alphas, 0);
    const auto want = gradients(heads, in, alphas, 0);
    for (int64_t chunk : {1, 2, 3, 5, 9}) {
      INFO("chunk " << chunk);
      const DSparkTerms t = dspark_objective(heads, in, alphas, chunk);
      const auto a = values(one), b = values(t);
      for (size_t i = 0; i < a.size(); ++i) CHECK(torch::allclose(a[i], b[i], 1e-12, 1e-12));
      CHECK(t.ce_num.requires_grad());
      CHECK_FALSE(t.tau_num.requires_grad());
      const auto got = gradients(heads, in, alphas, chunk);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(torch::allclose(got[i], want[i], 1e-12, 1e-13));
      // Without a graph: the same values.
      torch::NoGradGuard guard;
      const DSparkTerms ng = dspark_objective(heads, in, alphas, chunk);
      CHECK_FALSE(ng.ce_num.requires_grad());
      CHECK(torch::allclose(ng.ce_num, one.ce_num, 1e-12, 1e-12));
    }
  }
}

TEST_CASE("dspark objective: gradients of any combination of the terms, chunked",
          "[model][dspark]") {
  // The chunked path takes the gradient of the loss's own combination while it runs forward and
  // scales it in backward; a combination in another proportion (one term alone, other weights)
  // reruns the chunks in backward. Both equal one pass's autograd graph.
  const DSparkAlphas alphas{0.1, 0.9, 1.0};
  DSparkHeads heads = make_heads(heads_config(4, MarkovHeadType::kGated, true, true), 11);
  const DSparkObjectiveInputs in = random_inputs(2, 5, 4, 8);
  using Combine = std::function<torch::Tensor(const DSparkTerms&)>;
  const std::vector<std::pair<const char*, Combine>> combos = {
      {"the loss, scaled",
       [&](const DSparkTerms& t) { return dspark_loss(t, alphas, in.loss_weights.sum(), 0.37); }},
      {"ce alone", [](const DSparkTerms& t) { return t.ce_num * 2.0; }},
      {"l1 and confidence, other weights",
       [](const DSparkTerms& t) { return t.l1_num * 0.25 + t.confidence_num * 3.0; }}};
  const auto grads = [&](int64_t chunk, const Combine& f) {
    heads->zero_grad();
    in.hidden4d.mutable_grad() = torch::Tensor();
    f(dspark_objective(heads, in, alphas, chunk)).backward();
    std::vector<torch::Tensor> out{in.hidden4d.grad().clone()};
    for (auto& p : heads->parameters())
      out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return out;
  };
  for (const auto& [name, f] : combos) {
    INFO(name);
    const auto want = grads(0, f);
    CHECK(want[0].abs().max().item<double>() > 0);
    for (int64_t chunk : {1, 3}) {
      INFO("chunk " << chunk);
      const auto got = grads(chunk, f);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(torch::allclose(got[i], want[i], 1e-12, 1e-13));
    }
  }
}

TEST_CASE("dspark objective: the blocks' accepted counts, once per chunk", "[model][dspark]") {
  DSparkHeads heads = make_heads(heads_config(4, MarkovHeadType::kVanilla, false, false), 21);
  DSparkObjectiveInputs in = random_inputs(2, 5, 4, 22);
  const DSparkAlphas alphas{0.1, 0.9, 0.0};
  // The draft's teacher-forced argmax, from its definition; most labels become it, so runs of
  // every length occur.
  torch::Tensor z;
  {
    torch::NoGradGuard guard;
    auto& m = *heads->markov_head;
    z = torch::matmul(in.hidden4d, in.lm_head_weight.t()) +
        torch::matmul(m.markov_w1->weight.index({in.prev_token_ids}), m.markov_w2->weight.t());
    torch::manual_seed(23);
    in.target_ids =
        torch::where(torch::rand(in.target_ids.sizes()) < 0.8, z.argmax(-1), in.target_ids);
  }
  const torch::Tensor pred = z.argmax(-1);
  std::vector<int64_t> want;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < 5; ++j) {
      int64_t run = 0;
      while (run < 4 && in.eval_mask[b][j][run].item<bool>() &&
             pred[b][j][run].item<int64_t>() == in.target_ids[b][j][run].item<int64_t>())
        ++run;
      want.push_back(run);
    }
  }
  const torch::Tensor expected = longs(want, {2, 5});
  REQUIRE(expected.max().item<int64_t>() >= 2);
  for (int64_t chunk : {0, 2, 5}) {
    for (bool graph : {true, false}) {
      INFO("chunk " << chunk << (graph ? ", with backward" : ", no graph"));
      std::vector<torch::Tensor> accepted;
      {
        torch::AutoGradMode mode(graph);
        const DSparkTerms t = dspark_objective(heads, in, alphas, chunk, &accepted);
        if (graph) dspark_loss(t, alphas, in.loss_weights.sum()).backward();
      }
      // One tensor per chunk: the backward's rerun of the chunks appends nothing.
      CHECK(accepted.size() == (chunk == 2 ? 3u : 1u));
      CHECK(torch::equal(torch::cat(accepted, 1), expected));
    }
  }
}

TEST_CASE("dspark objective: the chunked backward against finite differences", "[model][dspark]") {
  // The confidence loss's target (the acceptance) is detached, so its gradient is not the
  // derivative of the loss: finite differences check the CE and L1 terms, whose gradients are
  // (the confidence head's are checked against the unchunked graph and against SpecForge).
  const DSparkAlphas alphas{0.4, 0.6, 0.0};
  DSparkHeads heads = make_heads(heads_config(3, MarkovHeadType::kRnn, true, true), 9);
  DSparkObjectiveInputs in = random_inputs(1, 3, 3, 10);
  const auto grads = gradients(heads, in, alphas, 1);
  auto loss_at = [&](const torch::Tensor& h) {
    torch::NoGradGuard guard;
    DSparkObjectiveInputs moved = in;
    moved.hidden4d = h;
    const DSparkTerms t = dspark_objective(heads, moved, alphas, 1);
    return dspark_loss(t, alphas, in.loss_weights.sum()).item<double>();
  };
  torch::manual_seed(12);
  const torch::Tensor dir = torch::randn_like(in.hidden4d);
  const double eps = 1e-6;
  const torch::Tensor h = in.hidden4d.detach();
  const double numeric = (loss_at(h + eps * dir) - loss_at(h - eps * dir)) / (2 * eps);
  const double analytic = (grads[0] * dir).sum().item<double>();
  CHECK(analytic == Approx(numeric).epsilon(1e-6));
  // And along one parameter of the recurrence.
  auto& joint = heads->markov_head->joint_proj->weight;
  const torch::Tensor pdir = torch::randn_like(joint);
  auto loss_with = [&](double step) {
    torch::NoGradGuard guard;
    joint.add_(step * pdir);
    const double v = loss_at(h);
    joint.sub_(step * pdir);
    return v;
  };
  size_t index = 1;
  for (const auto& p : heads->named_parameters()) {
    if (p.key() == "markov_head.joint_proj.weight") break;
    ++index;
  }
  const double pnum = (loss_with(eps) - loss_with(-eps)) / (2 * eps);
  CHECK((grads[index] * pdir).sum().item<double>() == Approx(pnum).epsilon(1e-6));
}

TEST_CASE("dspark objective: what is read when, and errors", "[model][dspark]") {
  DSparkHeads heads = make_heads(heads_config(4, MarkovHeadType::kVanilla, true, false), 13);
  DSparkObjectiveInputs in = random_inputs(1, 2, 4, 14);
  // The target is read with L1, or with a confidence head and its alpha.
  CHECK(dspark_needs_target(heads, {0.1, 0.9, 0.0}));
  CHECK(dspark_needs_target(heads, {0.1, 0.0, 1.0}));
  CHECK_FALSE(dspark_needs_target(heads, {1.0, 0.0, 0.0}));
  DSparkHeads no_conf = make_heads(heads_config(4, MarkovHeadType::kVanilla, false, false), 13);
  CHECK_FALSE(dspark_needs_target(no_conf, {1.0, 0.0, 1.0}));

  in.aligned_target_hidden = torch::Tensor();
  const DSparkTerms ce_only = dspark_objective(no_conf, in, {1.0, 0.0, 1.0}, 0);
  CHECK_FALSE(ce_only.has_target);
  CHECK(ce_only.tau_den.item<double>() == 0);
  CHECK_THROWS_WITH(dspark_objective(heads, in, {0.1, 0.9, 1.0}, 0),
                    Contains("target_last_hidden_states"));
  CHECK_THROWS_AS(dspark_objective(heads, in, {0.1, 0.9, 1.0}, 0), fsdp::UsageError);

  in = random_inputs(1, 2, 4, 14);
  CHECK_THROWS_WITH(dspark_objective(heads, in, {0.1, -0.9, 1.0}, 0),
                    Contains("dspark_l1_loss_alpha"));
  CHECK_THROWS_WITH(dspark_objective(heads, in, {0.1, 0.9, 1.0}, -1),
                    Contains("objective_chunk_blocks"));
  DSparkObjectiveInputs bad = in;
  bad.target_ids = bad.target_ids.narrow(2, 0, 3);
  CHECK_THROWS_AS(dspark_objective(heads, bad, {0.1, 0.9, 1.0}, 0), fsdp::Error);
  bad = in;
  bad.lm_head_weight = torch::randn({23, 8}, kF64);
  CHECK_THROWS_WITH(dspark_objective(heads, bad, {0.1, 0.9, 1.0}, 0), Contains("vocab_size"));
  const DSparkTerms t = dspark_objective(heads, in, {0.1, 0.9, 1.0}, 0);
  CHECK_THROWS_AS(dspark_loss(t, {0.1, 0.9, 1.0}, torch::zeros({}, kF64)), fsdp::UsageError);
}
