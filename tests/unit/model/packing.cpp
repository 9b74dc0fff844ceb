// Exact packing in the model (docs/usage.md "Packing"): documents packed into one row give the
// same losses, metrics and gradients as each document run as a micro-batch of its own (the
// unpacked micro-batch-1 accumulation), within 1e-6 in fp32, for every objective and
// normalisation, T = 1, 3, 7, the efficient and dense attention, the chunked head, activation
// checkpointing and the draft variants; documents of length 1, of the maximum length and without
// a loss token among them. The attention itself: packed efficient == packed dense == each
// document alone.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/draft_model.h"
#include "model/ttt_attention.h"
#include "model/ttt_loss.h"
#include "support/random_draft.h"
#include "support/small_draft.h"

using namespace fsdp::model;

namespace {

DraftConfig config(bool norm_output = false, int64_t layers = 1) {
  DraftConfig c = fsdp::testing::small_draft();  // 4 heads over 2 KV heads: GQA
  c.max_position_embeddings = 32;
  c.norm_output = norm_output;
  c.num_hidden_layers = layers;
  c.validate();
  return c;
}

// One sample as its own micro-batch: [1, L] tensors, target_p [1, L + T, Vd].
struct Doc {
  at::Tensor ids, mask, loss_mask, aux;
  TargetDistribution target;
  int64_t length() const { return ids.size(1); }
};

// Loss mask as process_sample leaves it: a prompt, a gap, the last position out of the loss.
Doc make_doc(const DraftConfig& c, int64_t L, int64_t T, bool no_loss = false) {
  Doc d;
  d.ids = torch::randint(0, c.vocab_size, {1, L}, torch::kLong);
  d.mask = torch::ones({1, L}, torch::kLong);
  d.loss_mask = torch::ones({1, L}, torch::kLong);
  d.loss_mask[0].narrow(0, 0, L / 4).zero_();
  if (L > 8) d.loss_mask[0][L / 2] = 0;
  d.loss_mask[0][L - 1] = 0;
  if (no_loss) d.loss_mask.zero_();
  d.aux = torch::randn({1, L, c.fc_in_features()}) * 2;
  d.target.target_p = (torch::randn({1, L + T, c.draft_vocab()}) * 2).softmax(-1);
  d.target.position_mask = d.loss_mask * torch::rand({1, L}).gt(0.2).to(torch::kLong);
  d.target.draft_mass = torch::rand({1, L}) * 0.5 + 0.5;
  return d;
}

// Documents back to back in one row (the target's T appended rows are never read on loss rows).
Doc pack(const std::vector<Doc>& docs, int64_t T, std::vector<int64_t>* lengths) {
  std::vector<at::Tensor> ids, mask, lm, aux, tp, pm, dm;
  for (const Doc& d : docs) {
    lengths->push_back(d.length());
    ids.push_back(d.ids);
    mask.push_back(d.mask);
    lm.push_back(d.loss_mask);
    aux.push_back(d.aux);
    tp.push_back(d.target.target_p.narrow(1, 0, d.length()));
    pm.push_back(d.target.position_mask);
    dm.push_back(d.target.draft_mass);
  }
  Doc p;
  p.ids = at::cat(ids, 1);
  p.mask = at::cat(mask, 1);
  p.loss_mask = at::cat(lm, 1);
  p.aux = at::cat(aux, 1);
  tp.push_back(at::full({1, T, docs[0].target.target_p.size(2)},
                        1.0 / static_cast<double>(docs[0].target.target_p.size(2))));
  p.target.target_p = at::cat(tp, 1);
  p.target.position_mask = at::cat(pm, 1);
  p.target.draft_mass = at::cat(dm, 1);
  return p;
}

// What the trainer adds up over a step's micro-batches.
struct Sums {
  at::Tensor loss, objective, ploss, correct, loss_tokens, position_tokens, accept_rate,
      accept_rate_renorm, accepted, anchors, chain_hits, draft_accepted, drafts, valid_tokens,
      batch_acc;
  int64_t units = 0;
  std::vector<at::Tensor> grads;
  void add(const StepOutput& o) {
    const auto plus = [](at::Tensor& a, const at::Tensor& b) {
      a = a.defined() ? a + b.detach().to(at::kDouble) : b.detach().to(at::kDouble);
    };
    plus(loss, o.loss);
    plus(objective, o.objective);
    plus(ploss, o.ploss);
    plus(correct, o.correct);
    plus(loss_tokens, o.loss_tokens);
    plus(position_tokens, o.position_tokens);
    plus(accept_rate, o.accept_rate);
    plus(accept_rate_renorm, o.accept_rate_renorm);
    plus(accepted, o.accepted);
    plus(anchors, o.anchors);
    plus(chain_hits, o.chain_hits);
    plus(draft_accepted, o.draft_accepted);
    plus(drafts, o.drafts);
    plus(valid_tokens, o.valid_tokens);
    plus(batch_acc, o.batch_acc.defined() ? o.batch_acc : o.acc);
    units += o.units;
  }
};

Sums unpacked(Eagle3Draft& m, const std::vector<Doc>& docs, LossOptions o) {
  m->zero_grad();
  o.accumulation_steps = static_cast<int64_t>(docs.size());
  Sums s;
  for (const Doc& d : docs) {
    StepOutput out = ttt_step(*m, d.target, d.ids, d.mask, d.loss_mask, d.aux, o);
    out.loss.backward();
    s.add(out);
  }
  for (const auto& p : m->trainable_parameters()) s.grads.push_back(p.grad().clone());
  return s;
}

// The documents in the given micro-batches (lists of document indices).
Sums packed(Eagle3Draft& m, const std::vector<Doc>& docs,
            const std::vector<std::vector<size_t>>& bins, LossOptions o) {
  m->zero_grad();
  o.accumulation_steps = static_cast<int64_t>(docs.size());
  Sums s;
  for (const auto& bin : bins) {
    std::vector<Doc> part;
    for (size_t k : bin) part.push_back(docs[k]);
    std::vector<int64_t> lengths;
    const Doc p = pack(part, o.ttt_length, &lengths);
    StepOutput out = ttt_step(*m, p.target, p.ids, p.mask, p.loss_mask, p.aux, o, lengths);
    CHECK(out.units == static_cast<int64_t>(bin.size()));
    out.loss.backward();
    s.add(out);
  }
  for (const auto& p : m->trainable_parameters()) s.grads.push_back(p.grad().clone());
  return s;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1.0, b.to(at::kDouble).abs().max().item<double>());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

void check_same(const Sums& got, const Sums& want) {
  CHECK(got.units == want.units);
  CHECK(rel_diff(got.loss, want.loss) <= 1e-6);
  CHECK(rel_diff(got.ploss, want.ploss) <= 1e-6);
  CHECK(rel_diff(got.objective, want.objective) <= 1e-6);
  CHECK(rel_diff(got.accept_rate, want.accept_rate) <= 1e-6);
  CHECK(rel_diff(got.accept_rate_renorm, want.accept_rate_renorm) <= 1e-6);
  CHECK(rel_diff(got.batch_acc, want.batch_acc) <= 1e-6);
  for (auto [name, a, b] :
       {std::tuple<const char*, at::Tensor, at::Tensor>{"correct", got.correct, want.correct},
        {"loss_tokens", got.loss_tokens, want.loss_tokens},
        {"position_tokens", got.position_tokens, want.position_tokens},
        {"accepted", got.accepted, want.accepted},
        {"anchors", got.anchors, want.anchors},
        {"chain_hits", got.chain_hits, want.chain_hits},
        {"draft_accepted", got.draft_accepted, want.draft_accepted},
        {"drafts", got.drafts, want.drafts},
        {"valid_tokens", got.valid_tokens, want.valid_tokens}}) {
    INFO(name);
    CHECK(torch::equal(a, b));
  }
  REQUIRE(got.grads.size() == want.grads.size());
  for (size_t k = 0; k < got.grads.size(); ++k) {
    INFO("parameter " << k);
    CHECK(rel_diff(got.grads[k], want.grads[k]) <= 1e-6);
  }
}

// Lengths 1 (no loss row) to 16 (the longest), one document without a loss token.
std::vector<Doc> documents(const DraftConfig& c, int64_t T) {
  std::vector<Doc> docs;
  for (int64_t L : {7, 1, 16, 3, 12, 2, 9}) docs.push_back(make_doc(c, L, T));
  docs.push_back(make_doc(c, 5, T, /*no_loss=*/true));
  return docs;
}

// Two micro-batches, documents out of order in them; and everything in one row.
const std::vector<std::vector<std::vector<size_t>>> kPlans = {
    {{2, 1, 5, 7}, {0, 3, 4, 6}},
    {{0, 1, 2, 3, 4, 5, 6, 7}},
};

std::vector<std::pair<std::string, LossOptions>> objectives(int64_t T) {
  LossOptions base;
  base.ttt_length = T;
  std::vector<std::pair<std::string, LossOptions>> out{{"soft_ce", base}};
  LossOptions recompute = base;
  recompute.recompute_loss = true;
  out.emplace_back("soft_ce, recomputed", recompute);
  LossOptions tokens = base;
  tokens.normalization = LossNormalization::kValidTokens;
  out.emplace_back("per-token normalisation", tokens);
  LossOptions mix = base;
  mix.loss_terms = parse_loss_spec(R"({"kl_div": 0.4, "tv": 0.3, "jsd": 0.2, "nla": 0.1})");
  out.emplace_back("mix of terms", mix);
  LossOptions lambda = base;
  lambda.lk = LossOptions::LK::kLambda;
  lambda.kl_scale = 0.7;
  lambda.kl_decay = 1.3;
  out.emplace_back("LK lambda", lambda);
  LossOptions alpha = base;
  alpha.lk = LossOptions::LK::kAlpha;
  out.emplace_back("LK alpha", alpha);
  LossOptions chunked = base;
  chunked.head_chunk_rows = 3;
  out.emplace_back("chunked head", chunked);
  LossOptions dense = base;
  dense.attention = AttentionImpl::kDense;
  out.emplace_back("dense attention", dense);
  return out;
}

}  // namespace

TEST_CASE("packing: packed documents equal each document as its own micro-batch",
          "[model][packing]") {
  const DraftConfig c = config();
  torch::manual_seed(5);
  Eagle3Draft m(c);
  fsdp::testing::randomise_draft(m);
  for (int64_t T : {1, 3, 7}) {
    const std::vector<Doc> docs = documents(c, T);
    for (const auto& [name, options] : objectives(T)) {
      LossOptions plain = options;
      plain.attention = AttentionImpl::kEfficient;  // the reference is the efficient unpacked
      const Sums want = unpacked(m, docs, plain);
      for (const auto& plan : kPlans) {
        INFO("T " << T << ", " << name << ", " << plan.size() << " micro-batch(es)");
        check_same(packed(m, docs, plan, options), want);
      }
    }
  }
}

TEST_CASE("packing: activation checkpointing, norm_output and a two-layer draft",
          "[model][packing]") {
  for (const auto& [variant, cfg] :
       {std::pair<std::string, DraftConfig>{"norm_output", config(true)},
        {"two layers", config(false, 2)},
        {"checkpointed layer", config()}}) {
    INFO(variant);
    torch::manual_seed(9);
    Eagle3Draft m(cfg);
    fsdp::testing::randomise_draft(m);
    m->set_checkpoint_layer(variant == "checkpointed layer");
    LossOptions o;
    o.ttt_length = 3;
    const std::vector<Doc> docs = documents(cfg, 3);
    check_same(packed(m, docs, kPlans[0], o), unpacked(m, docs, o));
  }
}

TEST_CASE("packing: document-aware attention, efficient and dense", "[model][packing]") {
  torch::manual_seed(3);
  const std::vector<int64_t> docs{1, 4, 3, 8};
  const int64_t S = 16, B = 1, nh = 4, nkv = 2, d = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const SeqLayout layout(torch::ones({B, S}, torch::kLong), docs);
  for (int64_t steps : {1, 3}) {
    INFO(steps << " step(s)");
    at::Tensor q = torch::randn({B, nh, S, d}, torch::requires_grad());
    std::vector<at::Tensor> ks, vs;
    for (int64_t j = 0; j < steps; ++j) {
      ks.push_back(torch::randn({B, nkv, S, d}, torch::requires_grad()));
      vs.push_back(torch::randn({B, nkv, S, d}, torch::requires_grad()));
    }
    const at::Tensor g = torch::randn({B, nh, S, d});
    std::vector<at::Tensor> outs, grads;
    for (AttentionImpl impl : {AttentionImpl::kEfficient, AttentionImpl::kDense}) {
      at::Tensor out = ttt_attention(q, ks, vs, layout, scale, impl);
      std::vector<at::Tensor> inputs{q};
      inputs.insert(inputs.end(), ks.begin(), ks.end());
      inputs.insert(inputs.end(), vs.begin(), vs.end());
      auto gr = torch::autograd::grad({out}, inputs, {g});
      outs.push_back(out.detach());
      grads.push_back(at::cat(
          {gr[0].flatten(), at::cat(std::vector<at::Tensor>(gr.begin() + 1, gr.end())).flatten()}));
    }
    CHECK(rel_diff(outs[0], outs[1]) <= 1e-6);
    CHECK(rel_diff(grads[0], grads[1]) <= 1e-6);
    // Each document alone (unpacked, its own positions 0..L-1) gives the same rows.
    int64_t s0 = 0;
    for (const int64_t L : docs) {
      std::vector<at::Tensor> kd, vd;
      for (int64_t j = 0; j < steps; ++j) {
        kd.push_back(ks[j].detach().narrow(2, s0, L));
        vd.push_back(vs[j].detach().narrow(2, s0, L));
      }
      const at::Tensor alone = ttt_attention(q.detach().narrow(2, s0, L), kd, vd,
                                             torch::ones({B, L}, torch::kLong), scale);
      CHECK(rel_diff(outs[0].narrow(2, s0, L), alone) <= 1e-6);
      s0 += L;
    }
  }
}

TEST_CASE("packing: a layout that is not one row of whole documents is refused",
          "[model][packing]") {
  const at::Tensor q = torch::randn({1, 2, 6, 4});
  const std::vector<at::Tensor> k{torch::randn({1, 2, 6, 4})}, v{torch::randn({1, 2, 6, 4})};
  const at::Tensor ones = torch::ones({1, 6}, torch::kLong);
  CHECK_THROWS_AS(ttt_attention(q, k, v, SeqLayout(ones, {2, 3}), 0.5), fsdp::Error);
  CHECK_THROWS_AS(ttt_attention(q, k, v, SeqLayout(ones, {6, 0}), 0.5), fsdp::Error);
  CHECK_THROWS_AS(LossRows::build(torch::ones({2, 3}, torch::kLong), 2, at::kCPU, {3, 3}),
                  fsdp::Error);
  // One document is the unpacked row.
  CHECK(rel_diff(ttt_attention(q, k, v, SeqLayout(ones, {6}), 0.5),
                 ttt_attention(q, k, v, ones, 0.5)) == 0.0);
}

TEST_CASE("packing: loss rows, runs and replies stay inside each document", "[model][packing]") {
  // Two documents, every position but each one's last a loss position.
  const at::Tensor lm = torch::tensor({{1, 1, 1, 0, 1, 1, 1, 1, 0}}, torch::kLong);
  const LossRows r = LossRows::build(lm, 3, at::kCPU, {4, 5});
  CHECK(r.count == std::vector<int64_t>{7, 5, 3});  // step i: rows with t - i in the document
  CHECK(torch::equal(r.run, torch::tensor({3, 2, 1, 3, 3, 2, 1})));
  CHECK(torch::equal(r.doc, torch::tensor({0, 0, 0, 1, 1, 1, 1})));
  CHECK(torch::equal(r.doc_count, torch::tensor({{3.f, 4.f}, {2.f, 3.f}, {1.f, 2.f}})));
  CHECK(torch::equal(r.doc_length, torch::tensor({4.f, 5.f})));
  CHECK(r.pre.numel() == 0);  // each reply starts at its document's first position
  CHECK(torch::equal(r.engine_start, torch::tensor({0, 1})));
}
