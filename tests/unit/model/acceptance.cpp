// The unroll's acceptance metrics against brute-force counts written out here (docs/model.md
// "Acceptance length"): accuracy through d2t, the engine's drafts walked one by one
// (accept_len), the all-anchor chains per step (accept_len_all_anchors, cond_acc) and the
// expected acceptance sum_v min(p, q) with p the target's own probabilities (acceptance_rate,
// SpecForge's) and renormalised over the draft vocabulary (acceptance_rate_renorm).
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/draft_model.h"
#include "model/target_head.h"
#include "model/ttt_loss.h"

using namespace fsdp::model;

namespace {

DraftConfig config(int64_t V, int64_t Vd) {
  DraftConfig c;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 12;
  c.vocab_size = V;
  c.draft_vocab_size = Vd;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 64;
  c.validate();
  return c;
}

Eagle3Draft random_model(const DraftConfig& cfg, uint64_t seed) {
  Eagle3Draft model{cfg};
  torch::manual_seed(seed);
  model->to(torch::kDouble);
  torch::NoGradGuard g;
  for (auto& p : model->parameters()) p.uniform_(-0.7, 0.7);
  return model;
}

// d2t of a t2d: draft id j is the j-th target id t2d selects (ascending), j + d2t[j].
at::Tensor d2t_for(const at::Tensor& t2d) {
  at::Tensor used = t2d.nonzero().view({-1});
  return used - torch::arange(used.numel(), torch::kLong);
}

// Step i's draft argmax at draft row p of sample b, as a target id through d2t.
int64_t proposal(const std::vector<at::Tensor>& logits, const at::Tensor& d2t, int64_t i, int64_t b,
                 int64_t p) {
  const int64_t best = logits[static_cast<size_t>(i)][b][p].argmax().item<int64_t>();
  return best + d2t[best].item<int64_t>();
}

struct Counts {
  double accepted = 0, drafts = 0;  // the engine's drafts
  double anchors = 0;
  std::vector<double> chain_hits;  // all-anchor chains alive after step i
};

// The brute force of docs/model.md: each reply a..e (a run of loss positions) is drafted by
// the engine from row a-1 (row a at a sample's start); a draft at row p proposes the tokens
// scored at rows p..p+T-1, as many as are left up to row e-2; n leading hits are accepted and
// the next draft starts at p+n+1. Anchors: every loss row t0 with loss rows t0..t0+T-1.
Counts brute_force(const std::vector<at::Tensor>& logits, const at::Tensor& d2t,
                   const at::Tensor& target_ids, const at::Tensor& loss_mask, int64_t T) {
  Counts c;
  c.chain_hits.assign(static_cast<size_t>(T), 0.0);
  const int64_t B = loss_mask.size(0), S = loss_mask.size(1);
  const auto hit = [&](int64_t i, int64_t b, int64_t p) {
    return proposal(logits, d2t, i, b, p) == target_ids[b][p + i].item<int64_t>();
  };
  const auto loss = [&](int64_t b, int64_t t) { return loss_mask[b][t].item<int64_t>() != 0; };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < S;) {
      if (!loss(b, t)) {
        ++t;
        continue;
      }
      const int64_t a = t;
      while (t + 1 < S && loss(b, t + 1)) ++t;
      const int64_t e = t++;
      for (int64_t p = a >= 1 ? a - 1 : a; p <= e - 2;) {
        const int64_t left = std::min(T, e - 1 - p);
        int64_t n = 0;
        while (n < left && hit(n, b, p)) ++n;
        c.drafts += 1;
        c.accepted += static_cast<double>(n);
        p += n + 1;
      }
    }
    for (int64_t t0 = 0; t0 + T <= S; ++t0) {
      bool full = true;
      for (int64_t i = 0; i < T; ++i) full = full && loss(b, t0 + i);
      if (!full) continue;
      c.anchors += 1;
      for (int64_t i = 0; i < T && hit(i, b, t0); ++i) c.chain_hits[static_cast<size_t>(i)] += 1;
    }
  }
  return c;
}

// Target ids that make the draft's chains hit in places: row t copies step i's proposal at row
// t - i with i = (t + b + shift) % (T + 1) (a miss, an id outside the draft vocabulary, when i
// is T or reaches before the sample), and every `noise`-th row is a random id.
at::Tensor designed_targets(const std::vector<at::Tensor>& logits, const at::Tensor& d2t, int64_t B,
                            int64_t S, int64_t T, int64_t V, int64_t shift, int64_t noise,
                            int64_t outside) {
  at::Tensor ids = torch::empty({B, S}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < S; ++t) {
      const int64_t i = (t + b + shift) % (T + 1);
      if ((t * 7 + b * 3) % noise == 0) {
        ids[b][t] = torch::randint(0, V, {1}, torch::kLong).item<int64_t>();
      } else if (i < T && t - i >= 0) {
        ids[b][t] = proposal(logits, d2t, i, b, t - i);
      } else {
        ids[b][t] = outside;
      }
    }
  }
  return ids;
}

// A dense target whose argmax and ids agree with target_ids: target_p puts most of its mass on
// the draft index of the id (when the id is in the draft vocabulary), position_mask = loss
// mask there.
TargetDistribution dense_target(const at::Tensor& target_ids, const at::Tensor& t2d,
                                const at::Tensor& loss_mask, int64_t T, int64_t Vd) {
  const int64_t B = target_ids.size(0), S = target_ids.size(1);
  at::Tensor draft_index = t2d.to(torch::kLong).cumsum(0) - 1;  // target id -> draft id
  TargetDistribution t;
  t.target_p = torch::rand({B, S + T, Vd}, torch::kFloat) * 0.1;
  t.position_mask = loss_mask.clone();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t id = target_ids[b][s].item<int64_t>();
      if (id >= 0 && id < t2d.numel() && t2d[id].item<bool>()) {
        t.target_p[b][s][draft_index[id].item<int64_t>()] = 1.0;
      } else {
        t.position_mask[b][s] = 0;
      }
    }
  }
  t.target_p /= t.target_p.sum(-1, true);
  t.target_ids = target_ids;
  return t;
}

}  // namespace

TEST_CASE("engine drafts and all-anchor chains: the unroll's counts equal a brute-force walk",
          "[model][ttt]") {
  const int64_t V = 24, Vd = 12, B = 3, S = 20;
  const DraftConfig cfg = config(V, Vd);
  // Replies: a run at a sample's start, runs of 1, 2 and 3 tokens, a long run, gaps.
  const at::Tensor loss_mask =
      torch::tensor({1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0,   //
                     0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0,   //
                     0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0},  //
                    torch::kLong)
          .view({B, S});
  at::Tensor mask = torch::ones({B, S}, torch::kLong);
  mask[2].narrow(0, 19, 1).zero_();
  double most_accepted = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (int64_t T : {1, 3, 4}) {
      for (int64_t shift : {0, 1, 2}) {
        INFO("seed " << seed << ", T " << T << ", shift " << shift);
        Eagle3Draft model = random_model(cfg, seed);
        at::Tensor t2d = torch::zeros({V}, torch::kBool);
        t2d.index_put_({torch::randperm(V).narrow(0, 0, Vd)}, true);
        const at::Tensor d2t = d2t_for(t2d);
        model->set_vocab_mapping(d2t, t2d);
        const int64_t outside = t2d.logical_not().nonzero()[0].item<int64_t>();
        at::Tensor ids = torch::randint(0, V, {B, S}, torch::kLong);
        at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
        torch::NoGradGuard g;
        const auto logits = ttt_logits(*model, ids, mask, aux, T, AttentionImpl::kDense);
        const at::Tensor target_ids = designed_targets(logits, d2t, B, S, T, V, shift,
                                                       11 + static_cast<int64_t>(seed), outside);
        const TargetDistribution target = dense_target(target_ids, t2d, loss_mask, T, Vd);
        const Counts want = brute_force(logits, d2t, target_ids, loss_mask, T);

        LossOptions opt;
        opt.ttt_length = T;
        opt.attention = AttentionImpl::kDense;
        const StepOutput r = ttt_step(*model, target, ids, mask, loss_mask, aux, opt);
        CHECK(r.drafts.item<double>() == want.drafts);
        CHECK(r.draft_accepted.item<double>() == want.accepted);
        CHECK(r.anchors.item<double>() == want.anchors);
        double accepted = 0;
        for (int64_t i = 0; i < T; ++i) {
          CHECK(r.chain_hits[i].item<double>() == want.chain_hits[static_cast<size_t>(i)]);
          accepted += want.chain_hits[static_cast<size_t>(i)];
        }
        CHECK(r.accepted.item<double>() == accepted);
        most_accepted = std::max(most_accepted, want.accepted / std::max(want.drafts, 1.0));
      }
    }
  }
  // The designed targets make some drafts accept long chains: the walk is not trivial.
  CHECK(most_accepted > 1.25);
}

TEST_CASE("engine drafts: the first draft of a reply is made at the row before it",
          "[model][ttt]") {
  // One reply at rows 2..5 (tokens x2..x5): the engine drafts from row 1 (x3 onward). With
  // its proposals hits and T = 2, the draft at row 1 accepts x3 and x4, the target adds x5
  // itself, and no draft follows: 1 draft, 2 accepted. Without the hit at row 1 (the row before
  // the reply, not a loss row) the first draft accepts nothing and more drafts follow.
  const int64_t V = 16, Vd = 16, B = 1, S = 8, T = 2;
  Eagle3Draft model = random_model(config(V, Vd), 9);
  const at::Tensor t2d = torch::ones({V}, torch::kBool);
  model->set_vocab_mapping(torch::zeros({Vd}, torch::kLong), t2d);
  const at::Tensor loss_mask = torch::tensor({0, 0, 1, 1, 1, 1, 0, 0}, torch::kLong).view({B, S});
  const at::Tensor mask = torch::ones({B, S}, torch::kLong);
  const at::Tensor ids = torch::randint(0, V, {B, S}, torch::kLong);
  const at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
  torch::NoGradGuard g;
  const auto logits = ttt_logits(*model, ids, mask, aux, T, AttentionImpl::kDense);
  // Row t's target: step (t - 1) % 2's proposal at row 1 or 3 (the drafts of a perfect run from
  // row 1), so the chains from rows 1 and 3 hit; the rest is what step 0 proposes there.
  at::Tensor target_ids = torch::empty({B, S}, torch::kLong);
  for (int64_t t = 0; t < S; ++t) target_ids[0][t] = logits[0][0][t].argmax().item<int64_t>();
  for (int64_t t = 1; t < S; ++t) {
    const int64_t i = (t - 1) % 2;
    target_ids[0][t] = logits[static_cast<size_t>(i)][0][t - i].argmax().item<int64_t>();
  }
  LossOptions opt;
  opt.ttt_length = T;
  opt.attention = AttentionImpl::kDense;
  StepOutput r = ttt_step(*model, dense_target(target_ids, t2d, loss_mask, T, Vd), ids, mask,
                          loss_mask, aux, opt);
  CHECK(r.drafts.item<double>() == 1);
  CHECK(r.draft_accepted.item<double>() == 2);
  // Make row 1's step-0 proposal miss.
  target_ids[0][1] = (target_ids[0][1].item<int64_t>() + 1) % V;
  r = ttt_step(*model, dense_target(target_ids, t2d, loss_mask, T, Vd), ids, mask, loss_mask, aux,
               opt);
  const Counts want =
      brute_force(logits, torch::zeros({Vd}, torch::kLong), target_ids, loss_mask, T);
  CHECK(r.drafts.item<double>() == want.drafts);
  CHECK(r.draft_accepted.item<double>() == want.accepted);
  CHECK(want.drafts >= 2);
}

TEST_CASE("accuracy through d2t: with the right d2t, the hits of argmax p (trainer path)",
          "[model][ttt]") {
  const int64_t V = 24, Vd = 12, B = 2, S = 10, T = 3;
  const DraftConfig cfg = config(V, Vd);
  double total_hits = 0;
  for (uint64_t seed : {4u, 5u, 6u}) {
    INFO("seed " << seed);
    Eagle3Draft model = random_model(cfg, seed);
    at::Tensor t2d = torch::zeros({V}, torch::kBool);
    t2d.index_put_({torch::randperm(V).narrow(0, 0, Vd)}, true);
    const at::Tensor d2t = d2t_for(t2d);
    model->set_vocab_mapping(d2t, t2d);
    const TargetHead head(torch::randn({V, 8}, torch::kDouble), t2d);
    const at::Tensor ids = torch::randint(0, V, {B, S}, torch::kLong);
    const at::Tensor mask = torch::ones({B, S}, torch::kLong);
    const at::Tensor loss_mask = torch::randint(0, 2, {B, S}, torch::kLong);
    loss_mask.narrow(1, 2, 5).fill_(1);
    const at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
    const at::Tensor target_hidden = torch::randn({B, S, 8}, torch::kDouble);
    torch::NoGradGuard g;
    LossOptions opt;
    opt.ttt_length = T;
    const auto logits = ttt_logits(*model, ids, mask, aux, T, AttentionImpl::kEfficient);
    const TargetDistribution dense = head.compute_dense(target_hidden, loss_mask, T);
    // Brute force, the definition before d2t: argmax z == argmax p where position_mask_i.
    std::vector<double> want(static_cast<size_t>(T), 0.0);
    for (int64_t i = 0; i < T; ++i) {
      const at::Tensor p = dense.target_p.narrow(1, i, S);
      const at::Tensor pm = shift_left(dense.position_mask, i);
      want[static_cast<size_t>(i)] =
          (logits[static_cast<size_t>(i)].argmax(-1).eq(p.argmax(-1)) * pm).sum().item<double>();
    }
    const StepOutput r = ttt_step(*model, head, ids, mask, loss_mask, aux, target_hidden, opt);
    for (int64_t i = 0; i < T; ++i)
      CHECK(r.correct[i].item<double>() == want[static_cast<size_t>(i)]);
    // The trainer's path and the dense target (with its target ids) count the same drafts.
    const StepOutput rd = ttt_step(*model, dense, ids, mask, loss_mask, aux, opt);
    CHECK(torch::equal(rd.correct, r.correct));
    CHECK(rd.drafts.item<double>() == r.drafts.item<double>());
    CHECK(rd.draft_accepted.item<double>() == r.draft_accepted.item<double>());
    const Counts walk = brute_force(logits, d2t, dense.target_ids, loss_mask, T);
    CHECK(r.drafts.item<double>() == walk.drafts);
    CHECK(r.draft_accepted.item<double>() == walk.accepted);

    total_hits += r.correct.sum().item<double>();
  }
  CHECK(total_hits > 0);
}

TEST_CASE("accuracy through d2t: a wrong d2t counts the wrong ids' hits, fewer", "[model][ttt]") {
  const int64_t V = 24, Vd = 12, B = 3, S = 16, T = 3;
  Eagle3Draft model = random_model(config(V, Vd), 7);
  at::Tensor t2d = torch::zeros({V}, torch::kBool);
  t2d.index_put_({torch::randperm(V).narrow(0, 0, Vd)}, true);
  const at::Tensor d2t = d2t_for(t2d);
  model->set_vocab_mapping(d2t, t2d);
  const at::Tensor ids = torch::randint(0, V, {B, S}, torch::kLong);
  const at::Tensor mask = torch::ones({B, S}, torch::kLong);
  const at::Tensor loss_mask = torch::randint(0, 2, {B, S}, torch::kLong);
  loss_mask.narrow(1, 3, 9).fill_(1);
  const at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
  torch::NoGradGuard g;
  LossOptions opt;
  opt.ttt_length = T;
  const auto logits = ttt_logits(*model, ids, mask, aux, T, AttentionImpl::kEfficient);
  const int64_t outside = t2d.logical_not().nonzero()[0].item<int64_t>();
  const TargetDistribution target = dense_target(
      designed_targets(logits, d2t, B, S, T, V, 0, 13, outside), t2d, loss_mask, T, Vd);
  const StepOutput right = ttt_step(*model, target, ids, mask, loss_mask, aux, opt);
  // A wrong d2t (each draft id mapped to the next one's target id): the hits of the right
  // mapping become misses; the count is that of the wrong ids, as SpecForge 0.2.0 counts.
  const at::Tensor used = t2d.nonzero().view({-1});
  const at::Tensor wrong = used.roll(-1) - torch::arange(Vd, torch::kLong);
  model->set_vocab_mapping(wrong, t2d);
  const StepOutput w = ttt_step(*model, target, ids, mask, loss_mask, aux, opt);
  for (int64_t i = 0; i < T; ++i) {
    INFO("step " << i);
    double old_definition = 0, wrong_ids = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = i; t < S; ++t) {
        if (loss_mask[b][t].item<int64_t>() == 0) continue;
        const at::Tensor z = logits[static_cast<size_t>(i)][b][t - i];
        old_definition +=
            target.position_mask[b][t].item<int64_t>() == 1 &&
            z.argmax().item<int64_t>() == target.target_p[b][t].argmax().item<int64_t>();
        wrong_ids +=
            proposal(logits, wrong, i, b, t - i) == target.target_ids[b][t].item<int64_t>();
      }
    }
    CHECK(right.correct[i].item<double>() == old_definition);
    CHECK(w.correct[i].item<double>() == wrong_ids);
    CHECK(old_definition > 0);
    CHECK(wrong_ids < old_definition);
  }
}

TEST_CASE(
    "expected acceptance: SpecForge's (the target's own probabilities) and renormalised, "
    "against explicit loops in double",
    "[model][ttt]") {
  const int64_t V = 20, Vd = 10, B = 2, S = 9, T = 3, H = 8;
  Eagle3Draft model = random_model(config(V, Vd), 11);
  at::Tensor t2d = torch::zeros({V}, torch::kBool);
  t2d.index_put_({torch::randperm(V).narrow(0, 0, Vd)}, true);
  model->set_vocab_mapping(d2t_for(t2d), t2d);
  const at::Tensor weight = torch::randn({V, H}, torch::kDouble);
  const TargetHead head(weight, t2d);
  const at::Tensor ids = torch::randint(0, V, {B, S}, torch::kLong);
  const at::Tensor mask = torch::ones({B, S}, torch::kLong);
  const at::Tensor loss_mask =
      torch::tensor({0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0}, torch::kLong)
          .view({B, S});
  const at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
  const at::Tensor target_hidden = torch::randn({B, S, H}, torch::kDouble);
  torch::NoGradGuard g;
  LossOptions opt;
  opt.ttt_length = T;
  const auto logits = ttt_logits(*model, ids, mask, aux, T, AttentionImpl::kEfficient);
  const StepOutput r = ttt_step(*model, head, ids, mask, loss_mask, aux, target_hidden, opt);
  const auto w = weight.accessor<double, 2>();
  const auto x = target_hidden.accessor<double, 3>();
  std::vector<int64_t> used;  // draft id j is target id used[j]
  for (int64_t k = 0; k < V; ++k)
    if (t2d[k].item<bool>()) used.push_back(k);
  for (int64_t i = 0; i < T; ++i) {
    INFO("step " << i);
    const auto z = logits[static_cast<size_t>(i)].accessor<double, 3>();
    double own = 0, renorm = 0, positions = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = i; t < S; ++t) {
        if (loss_mask[b][t].item<int64_t>() == 0) continue;
        // The target's logits over the full vocabulary, its argmax and its two normalisers.
        std::vector<double> zt(static_cast<size_t>(V), 0.0);
        int64_t best = 0;
        for (int64_t k = 0; k < V; ++k) {
          for (int64_t h = 0; h < H; ++h) zt[static_cast<size_t>(k)] += x[b][t][h] * w[k][h];
          if (zt[static_cast<size_t>(k)] > zt[static_cast<size_t>(best)]) best = k;
        }
        if (!t2d[best].item<bool>()) continue;  // position_mask 0: the target's token not drafted
        double full = 0, draft = 0;
        for (int64_t k = 0; k < V; ++k) full += std::exp(zt[static_cast<size_t>(k)]);
        for (int64_t k : used) draft += std::exp(zt[static_cast<size_t>(k)]);
        // The draft's softmax at draft row t - i.
        std::vector<double> q(static_cast<size_t>(Vd));
        double qsum = 0;
        for (int64_t j = 0; j < Vd; ++j)
          qsum += q[static_cast<size_t>(j)] = std::exp(z[b][t - i][j]);
        for (int64_t j = 0; j < Vd; ++j) {
          const double qj = q[static_cast<size_t>(j)] / qsum;
          const double e = std::exp(zt[static_cast<size_t>(used[static_cast<size_t>(j)])]);
          own += std::min(e / full, qj);
          renorm += std::min(e / draft, qj);
        }
        positions += 1;
      }
    }
    CHECK(positions > 0);
    CHECK(r.position_tokens[i].item<double>() == positions);
    CHECK(r.accept_rate[i].item<double>() == Approx(own).epsilon(1e-5));
    CHECK(r.accept_rate_renorm[i].item<double>() == Approx(renorm).epsilon(1e-5));
    // The target puts mass outside the draft vocabulary here: SpecForge's reads lower.
    CHECK(own < renorm - 1e-3);
    CHECK(r.accept_rate_renorm[i].item<double>() <= positions + 1e-4);
  }
  // A target without the draft vocabulary's mass (a dense TargetDistribution): both the same.
  const StepOutput d = ttt_step(*model, head.compute_dense(target_hidden, loss_mask, T), ids, mask,
                                loss_mask, aux, opt);
  CHECK(torch::equal(d.accept_rate, d.accept_rate_renorm));
  CHECK((d.accept_rate_renorm - r.accept_rate_renorm).abs().max().item<double>() < 1e-5);
}
