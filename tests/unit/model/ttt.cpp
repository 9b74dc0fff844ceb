// The TTT unroll end to end: state-dict names, unit hooks, a 2-position 2-step example computed
// by hand with scalar code (which keys each query sees, which RoPE position, which target row),
// efficient vs dense for the whole step, and finite-difference gradients in double.
#include <catch2/catch.hpp>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>

#include "model/draft_model.h"
#include "model/ttt_loss.h"

using namespace fsdp::model;

namespace {

DraftConfig small_config(int64_t H, int64_t nh, int64_t nkv, int64_t d, int64_t I, int64_t V,
                         int64_t Vd) {
  DraftConfig c;
  c.hidden_size = H;
  c.num_attention_heads = nh;
  c.num_key_value_heads = nkv;
  c.head_dim = d;
  c.intermediate_size = I;
  c.vocab_size = V;
  c.draft_vocab_size = Vd;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 16;
  c.validate();
  return c;
}

// Scalar helpers for the hand-computed example.
using Vec = std::vector<double>;
Vec row(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  return Vec(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}
Vec matvec(const at::Tensor& W, const Vec& x) {
  Vec y(W.size(0), 0.0);
  for (int64_t r = 0; r < W.size(0); ++r) {
    Vec w = row(W[r]);
    for (size_t c = 0; c < x.size(); ++c) y[r] += w[c] * x[c];
  }
  return y;
}
Vec rmsnorm(const Vec& x, const at::Tensor& weight, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= x.size();
  Vec w = row(weight), y(x.size());
  for (size_t k = 0; k < x.size(); ++k) y[k] = w[k] * x[k] / std::sqrt(ms + eps);
  return y;
}
Vec add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t k = 0; k < a.size(); ++k) y[k] = a[k] + b[k];
  return y;
}
// head_dim 2: inv_freq = theta^0 = 1, so the rotation angle is the position itself.
Vec rotate(const Vec& x, double position) {
  const double c = std::cos(position), s = std::sin(position);
  return {x[0] * c - x[1] * s, x[1] * c + x[0] * s};
}

struct Recorder : fsdp::UnitHooks {
  std::vector<std::string> events;
  void pre_forward(const std::string& unit) override { events.push_back("pre:" + unit); }
  void post_forward(const std::string& unit, const at::Tensor& out) override {
    events.push_back("post:" + unit + (out.requires_grad() ? "+grad" : ""));
  }
};

}  // namespace

TEST_CASE("state-dict names, buffers and parameter count", "[model][ttt]") {
  DraftConfig c = small_config(16, 4, 2, 4, 24, 40, 12);
  Eagle3Draft model(c);
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  std::vector<std::string> expected{"embed_tokens.weight",
                                    "fc.weight",
                                    "midlayer.hidden_norm.weight",
                                    "midlayer.input_layernorm.weight",
                                    "midlayer.self_attn.q_proj.weight",
                                    "midlayer.self_attn.k_proj.weight",
                                    "midlayer.self_attn.v_proj.weight",
                                    "midlayer.self_attn.o_proj.weight",
                                    "midlayer.post_attention_layernorm.weight",
                                    "midlayer.mlp.gate_proj.weight",
                                    "midlayer.mlp.up_proj.weight",
                                    "midlayer.mlp.down_proj.weight",
                                    "norm.weight",
                                    "lm_head.weight"};
  CHECK(names == expected);
  auto params = model->named_parameters();
  CHECK(params["fc.weight"].sizes() == at::IntArrayRef({16, 48}));
  CHECK(params["midlayer.self_attn.q_proj.weight"].sizes() == at::IntArrayRef({16, 32}));
  CHECK(params["midlayer.self_attn.k_proj.weight"].sizes() == at::IntArrayRef({8, 32}));
  CHECK(params["lm_head.weight"].sizes() == at::IntArrayRef({12, 16}));
  CHECK_FALSE(params["embed_tokens.weight"].requires_grad());
  int64_t trainable = 0;
  for (const auto& p : model->trainable_parameters()) trainable += p.numel();
  CHECK(trainable == count_parameters(c).trainable);
  auto buffers = model->named_buffers();
  REQUIRE(buffers.size() == 2);
  model->to(torch::kDouble);
  CHECK(model->d2t.scalar_type() == torch::kLong);
  CHECK(model->t2d.scalar_type() == torch::kBool);
  CHECK(model->named_buffers()["t2d"].scalar_type() == torch::kBool);
  CHECK(model->fc->weight.scalar_type() == torch::kDouble);
  auto exported = model->export_tensors();
  CHECK(exported.size() == expected.size() - 1 + 2);
  CHECK(exported.front().first == "fc.weight");
  CHECK(exported.back().first == "t2d");
}

TEST_CASE("units are announced in order: fc once, then 4 units per step", "[model][ttt]") {
  DraftConfig c = small_config(8, 2, 1, 4, 12, 20, 20);
  Eagle3Draft model(c);
  Recorder rec;
  model->set_unit_hooks(&rec);
  auto ids = torch::randint(0, 20, {1, 4}, torch::kLong);
  auto logits = ttt_logits(*model, ids, torch::ones({1, 4}, torch::kLong), torch::randn({1, 4, 24}),
                           2, AttentionImpl::kEfficient);
  std::vector<std::string> expected{"pre:fc", "post:fc+grad"};
  for (int i = 0; i < 2; ++i) {
    for (std::string u : {"embed_tokens", "midlayer", "norm", "lm_head"}) {
      expected.push_back("pre:" + u);
      expected.push_back("post:" + u + (u == "embed_tokens" ? "" : "+grad"));
    }
  }
  CHECK(rec.events == expected);
  model->set_unit_hooks(nullptr);
}

TEST_CASE("hand-computed 2-position 2-step unroll (shift, mask, RoPE position, target row)",
          "[model][ttt]") {
  torch::manual_seed(11);
  // H 2, one head of dim 2, V = Vd = 4, S = 2, T = 2.
  DraftConfig c = small_config(2, 1, 1, 2, 3, 4, 4);
  Eagle3Draft model(c);
  model->to(torch::kDouble);
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.uniform_(-1.0, 1.0);
  }
  auto& L = *model->midlayer;
  auto& A = *L.self_attn;
  const double eps = c.rms_norm_eps;
  at::Tensor ids = torch::tensor({3, 1}, torch::kLong).view({1, 2});
  at::Tensor aux = torch::randn({1, 2, 6}, torch::kDouble);

  for (int64_t len : {2, 1}) {
    INFO("valid length " << len);
    at::Tensor mask = torch::zeros({1, 2}, torch::kLong);
    mask.narrow(1, 0, len).fill_(1);
    // Visible (step, position) keys for the query at (position t, step i), written out.
    std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> visible = {
        {{0, 0}, {{0, 0}}},
        {{1, 0}, {{0, 0}, {0, 1}}},
        {{0, 1}, {{0, 0}, {1, 0}}},
        {{1, 1}, {{0, 0}, {0, 1}, {1, 1}}}};
    // Step 1 reads input_ids shifted left: position 0 sees id 1, position 1 the appended 0.
    const int64_t step_ids[2][2] = {{3, 1}, {1, 0}};
    std::map<std::pair<int, int>, Vec> K, Vv, Q;  // key (step, position)
    Vec h[2], logits_ref[2][2];
    for (int t = 0; t < 2; ++t) h[t] = matvec(model->fc->weight, row(aux[0][t]));
    for (int i = 0; i < 2; ++i) {
      Vec x[2];
      for (int t = 0; t < 2; ++t) {
        Vec e = row(model->embed_tokens->weight[step_ids[i][t]]);
        Vec a = rmsnorm(e, L.input_layernorm->weight, eps),
            b = rmsnorm(h[t], L.hidden_norm->weight, eps);
        x[t] = {a[0], a[1], b[0], b[1]};  // embedding first
        // Queries and new keys of step i are rotated with position t + i.
        Q[{i, t}] = rotate(matvec(A.q_proj->weight, x[t]), t + i);
        K[{i, t}] = rotate(matvec(A.k_proj->weight, x[t]), t + i);
        Vv[{i, t}] = matvec(A.v_proj->weight, x[t]);
      }
      for (int t = 0; t < 2; ++t) {
        Vec attn{0.0, 0.0};
        if (t < len) {
          const auto& keys = visible[{t, i}];
          std::vector<double> s;
          double mx = -1e300, z = 0;
          for (auto key : keys) {
            const Vec& k = K[key];
            s.push_back((Q[{i, t}][0] * k[0] + Q[{i, t}][1] * k[1]) / std::sqrt(2.0));
            mx = std::max(mx, s.back());
          }
          for (double& v : s) z += (v = std::exp(v - mx));
          for (size_t n = 0; n < keys.size(); ++n) {
            for (int k = 0; k < 2; ++k) attn[k] += s[n] / z * Vv[keys[n]][k];
          }
        }
        Vec h1 = add(h[t], matvec(A.o_proj->weight, attn));
        Vec y = rmsnorm(h1, L.post_attention_layernorm->weight, eps);
        Vec gate = matvec(L.mlp->gate_proj->weight, y), up = matvec(L.mlp->up_proj->weight, y);
        Vec act(gate.size());
        for (size_t k = 0; k < gate.size(); ++k)
          act[k] = gate[k] / (1 + std::exp(-gate[k])) * up[k];
        Vec out = add(h1, matvec(L.mlp->down_proj->weight, act));
        logits_ref[i][t] = matvec(model->lm_head->weight, rmsnorm(out, model->norm->weight, eps));
        h[t] = out;
      }
    }
    for (auto impl : {AttentionImpl::kEfficient, AttentionImpl::kDense}) {
      auto logits = ttt_logits(*model, ids, mask, aux, 2, impl);
      for (int i = 0; i < 2; ++i) {
        for (int t = 0; t < 2; ++t) {
          Vec got = row(logits[i][0][t]);
          for (int v = 0; v < 4; ++v) CHECK(got[v] == Approx(logits_ref[i][t][v]).margin(1e-12));
        }
      }
    }
    if (len != 2) continue;
    // Loss: step i at position t uses target row t + i and position_mask[t + i].
    TargetDistribution target;
    target.target_p = torch::rand({1, 4, 4}, torch::kDouble);
    target.target_p /= target.target_p.sum(-1, true);
    target.target_p = target.target_p.to(torch::kFloat);
    target.position_mask = torch::tensor({1, 1}, torch::kLong).view({1, 2});
    at::Tensor loss_mask = torch::tensor({1, 1}, torch::kLong).view({1, 2});
    LossOptions opt;
    opt.ttt_length = 2;
    opt.accumulation_steps = 2;
    StepOutput r = ttt_step(*model, target, ids, mask, loss_mask, aux, opt);
    auto ce = [&](const Vec& z, int64_t prow) {
      double mx = *std::max_element(z.begin(), z.end()), lse = 0;
      for (double v : z) lse += std::exp(v - mx);
      lse = mx + std::log(lse);
      Vec p = row(target.target_p[0][prow]);
      double out = 0;
      for (int v = 0; v < 4; ++v) out -= p[v] * (z[v] - lse);
      return out;
    };
    auto argmax = [](const Vec& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
    // Step 0: both positions count; step 1: position 1 is shifted out (mask 0). Divide by B*S=2.
    const double p0 = (ce(logits_ref[0][0], 0) + ce(logits_ref[0][1], 1)) / 2;
    const double p1 = ce(logits_ref[1][0], 1) / 2;
    CHECK(r.ploss[0].item<double>() == Approx(p0).epsilon(1e-6));
    CHECK(r.ploss[1].item<double>() == Approx(p1).epsilon(1e-6));
    CHECK(r.loss.item<double>() == Approx((p0 + 0.8 * p1) / 2).epsilon(1e-12));
    const double c0 = (argmax(logits_ref[0][0]) == argmax(row(target.target_p[0][0]))) +
                      (argmax(logits_ref[0][1]) == argmax(row(target.target_p[0][1])));
    const double c1 = argmax(logits_ref[1][0]) == argmax(row(target.target_p[0][1]));
    CHECK(r.correct[0].item<float>() == c0);
    CHECK(r.correct[1].item<float>() == c1);
    CHECK(r.loss_tokens[0].item<float>() == 2);
    CHECK(r.loss_tokens[1].item<float>() == 1);
    CHECK(r.acc[1].item<float>() == Approx(c1));
    CHECK(r.valid_tokens.item<int64_t>() == 2);
  }
}

namespace {

struct StepFixture {
  DraftConfig cfg = small_config(8, 2, 1, 4, 12, 20, 10);
  Eagle3Draft model{cfg};
  TargetHead head;
  at::Tensor ids, mask, loss_mask, aux, target_hidden;
  LossOptions opt;

  StepFixture() {
    torch::manual_seed(21);
    model->to(torch::kDouble);
    {
      torch::NoGradGuard g;
      for (auto& p : model->parameters()) p.uniform_(-0.7, 0.7);
    }
    at::Tensor t2d = torch::zeros({20}, torch::kBool);
    t2d.index_put_({torch::randperm(20).narrow(0, 0, 10)}, true);
    // d2t consistent with t2d (draft id j is the j-th target id t2d selects): accuracy
    // through d2t then counts exactly the hits of argmax p.
    at::Tensor used = t2d.nonzero().view({-1});
    model->set_vocab_mapping(used - torch::arange(10, torch::kLong), t2d);
    head = TargetHead(torch::randn({20, 8}, torch::kDouble), t2d);
    ids = torch::randint(0, 20, {2, 5}, torch::kLong);
    mask = torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, torch::kLong).view({2, 5});
    loss_mask = torch::tensor({0, 1, 1, 1, 0, 1, 1, 1, 0, 0}, torch::kLong).view({2, 5});
    aux = torch::randn({2, 5, 24}, torch::kDouble);
    // Make t2d tokens win the argmax often so several positions carry loss.
    target_hidden = torch::randn({2, 5, 8}, torch::kDouble);
    opt.ttt_length = 3;
  }
  double loss(AttentionImpl impl) {
    torch::NoGradGuard g;
    LossOptions o = opt;
    o.attention = impl;
    return ttt_step(*model, head, ids, mask, loss_mask, aux, target_hidden, o).loss.item<double>();
  }
};

}  // namespace

TEST_CASE("whole step: efficient and dense attention give the same loss and gradients",
          "[model][ttt]") {
  StepFixture f;
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<double> losses;
  for (auto impl : {AttentionImpl::kEfficient, AttentionImpl::kDense}) {
    f.model->zero_grad();
    LossOptions o = f.opt;
    o.attention = impl;
    StepOutput r =
        ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, o);
    r.loss.backward();
    losses.push_back(r.loss.item<double>());
    std::vector<at::Tensor> g;
    for (auto& p : f.model->trainable_parameters()) g.push_back(p.grad().clone());
    grads.push_back(g);
    CHECK(r.ploss.sizes() == at::IntArrayRef({3}));
    CHECK_FALSE(r.ploss.requires_grad());
    CHECK(r.position_tokens[0].item<float>() > 0);
  }
  CHECK(std::abs(losses[0] - losses[1]) < 1e-12);
  for (size_t k = 0; k < grads[0].size(); ++k) {
    INFO("parameter " << k);
    CHECK((grads[0][k] - grads[1][k]).abs().max().item<double>() < 1e-10);
  }
}

TEST_CASE("whole step: finite-difference gradients in double", "[model][ttt]") {
  StepFixture f;
  f.model->zero_grad();
  StepOutput r =
      ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, f.opt);
  r.loss.backward();
  const double h = 1e-5;
  int checked = 0;
  for (const auto& named : f.model->named_parameters()) {
    at::Tensor p = named.value();
    if (!p.requires_grad()) continue;
    at::Tensor flat = p.data().view(-1);
    at::Tensor grad = p.grad().view(-1);
    for (int64_t idx : {int64_t{0}, flat.numel() / 2, flat.numel() - 1}) {
      const double orig = flat[idx].item<double>();
      flat[idx] = orig + h;
      const double up = f.loss(AttentionImpl::kEfficient);
      flat[idx] = orig - h;
      const double down = f.loss(AttentionImpl::kEfficient);
      flat[idx] = orig;
      const double fd = (up - down) / (2 * h);
      const double g = grad[idx].item<double>();
      INFO(named.key() << "[" << idx << "] autograd " << g << " finite difference " << fd);
      CHECK(std::abs(fd - g) < 1e-7 * std::max(1.0, std::abs(g)));
      ++checked;
    }
  }
  CHECK(checked == 13 * 3);
}

TEST_CASE("per-valid-token normalisation and bad batches", "[model][ttt]") {
  StepFixture f;
  StepOutput a =
      ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, f.opt);
  LossOptions o = f.opt;
  o.normalization = LossNormalization::kValidTokens;
  StepOutput b = ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, o);
  for (int i = 0; i < 3; ++i) {
    const double n = std::max(1.0f, a.position_tokens[i].item<float>());
    CHECK(b.ploss[i].item<double>() == Approx(a.ploss[i].item<double>() * 10 / n).epsilon(1e-6));
  }
  CHECK_THROWS_WITH(ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux.narrow(2, 0, 20),
                             f.target_hidden, f.opt),
                    Catch::Contains("aux_hidden"));
  CHECK_THROWS_WITH(ttt_step(*f.model, f.head, f.ids, f.mask.narrow(1, 0, 4), f.loss_mask, f.aux,
                             f.target_hidden, f.opt),
                    Catch::Contains("attention_mask"));
  o.check_padding = true;
  at::Tensor left = f.mask.flip(1);
  CHECK_THROWS_WITH(ttt_step(*f.model, f.head, f.ids, left, f.loss_mask, f.aux, f.target_hidden, o),
                    Catch::Contains("right-padded"));
}

TEST_CASE("loss rows: indices of each step's rows", "[model][ttt]") {
  // B=2, S=4. Loss rows (flat b*4+t): 1, 2, 5, 7.
  at::Tensor lm = torch::tensor({0, 1, 1, 0, 0, 1, 0, 1}, torch::kLong).view({2, 4});
  LossRows r = LossRows::build(lm, 3, torch::kCPU);
  auto vec = [](const at::Tensor& t) {
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  CHECK(vec(r.rows) == std::vector<int64_t>{1, 2, 5, 7});
  // Step i keeps the rows with t >= i and feeds them from draft row b*4 + t - i.
  CHECK(vec(r.target[0]) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(vec(r.draft[0]) == std::vector<int64_t>{1, 2, 5, 7});
  CHECK(vec(r.target[1]) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(vec(r.draft[1]) == std::vector<int64_t>{0, 1, 4, 6});
  CHECK(vec(r.target[2]) == std::vector<int64_t>{1, 3});
  CHECK(vec(r.draft[2]) == std::vector<int64_t>{0, 5});
  CHECK(r.count == std::vector<int64_t>{4, 4, 2});
  // Each count is sum(loss_mask shifted left by i), the acc denominator of docs/reference.md §5.
  for (int64_t i = 0; i < 3; ++i) CHECK(shift_left(lm, i).sum().item<int64_t>() == r.count[i]);
  CHECK_THROWS_WITH(LossRows::build(lm.view({-1}), 3, torch::kCPU),
                    Catch::Contains("loss_mask must be [B, S]"));
}

TEST_CASE("loss rows: the step equals the all-rows loss of reference §5 (values and gradients)",
          "[model][ttt]") {
  StepFixture f;
  const int64_t T = f.opt.ttt_length, B = 2, S = 5;
  // All-rows formula: logits on every position, masks shifted, sums over all B*S positions.
  f.model->zero_grad();
  std::vector<at::Tensor> logits =
      ttt_logits(*f.model, f.ids, f.mask, f.aux, T, AttentionImpl::kEfficient);
  TargetDistribution target = f.head.compute_dense(f.target_hidden, f.loss_mask, T);
  at::Tensor want_loss = torch::zeros({}, torch::kDouble);
  std::vector<double> want_ploss, want_correct, want_pos;
  for (int64_t i = 0; i < T; ++i) {
    at::Tensor p = target.target_p.narrow(1, i, S).to(torch::kDouble);
    at::Tensor pm = shift_left(target.position_mask, i).to(torch::kDouble);
    at::Tensor ce = -(p * logits[i].log_softmax(-1)).sum(-1);
    at::Tensor ploss = (pm * ce).sum() / static_cast<double>(B * S);
    want_loss = want_loss + std::pow(0.8, static_cast<double>(i)) * ploss;
    want_ploss.push_back(ploss.item<double>());
    want_correct.push_back(
        (logits[i].argmax(-1).eq(p.argmax(-1)).to(torch::kDouble) * pm).sum().item<double>());
    want_pos.push_back(pm.sum().item<double>());
  }
  want_loss.backward();
  std::vector<at::Tensor> want_grads;
  for (auto& p : f.model->trainable_parameters()) want_grads.push_back(p.grad().clone());

  f.model->zero_grad();
  StepOutput r =
      ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, f.opt);
  r.loss.backward();
  CHECK(r.loss.item<double>() == Approx(want_loss.item<double>()).epsilon(1e-12));
  for (int64_t i = 0; i < T; ++i) {
    INFO("step " << i);
    CHECK(r.ploss[i].item<double>() == Approx(want_ploss[i]).epsilon(1e-6));
    CHECK(r.correct[i].item<double>() == want_correct[i]);
    CHECK(r.position_tokens[i].item<double>() == want_pos[i]);
    CHECK(r.loss_tokens[i].item<double>() == shift_left(f.loss_mask, i).sum().item<double>());
  }
  CHECK(want_pos[0] > 0);
  const auto params = f.model->trainable_parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    INFO("parameter " << k);
    CHECK((params[k].grad() - want_grads[k]).abs().max().item<double>() < 1e-12);
  }
}

TEST_CASE("loss rows: a micro-batch without loss tokens gives zero loss and zero gradients",
          "[model][ttt]") {
  StepFixture f;
  f.model->zero_grad();
  at::Tensor none = torch::zeros_like(f.loss_mask);
  StepOutput r = ttt_step(*f.model, f.head, f.ids, f.mask, none, f.aux, f.target_hidden, f.opt);
  CHECK(r.loss.item<double>() == 0.0);
  r.loss.backward();
  for (auto& p : f.model->trainable_parameters()) {
    INFO(p.sizes());
    CHECK((!p.grad().defined() || p.grad().abs().max().item<double>() == 0.0));
  }
  CHECK(r.loss_tokens.sum().item<double>() == 0.0);
  CHECK(r.acc.sum().item<double>() == 0.0);
  CHECK(r.valid_tokens.item<int64_t>() == 8);
}

namespace {

struct CheckpointRun {
  std::vector<double> ploss;
  std::vector<at::Tensor> grads;
  int64_t post_acc_calls = 0;
};

// One step with the decoder layer checkpointed or not; counts how often autograd accumulated
// into each trainable parameter (the sharding engine expects once per backward).
CheckpointRun checkpoint_run(StepFixture& f, bool checkpoint, AttentionImpl impl) {
  f.model->zero_grad();
  f.model->set_checkpoint_layer(checkpoint);
  LossOptions o = f.opt;
  o.attention = impl;
  CheckpointRun run;
  std::vector<at::Tensor> params = f.model->trainable_parameters();
  struct Count final : torch::autograd::PostAccumulateGradHook {
    int64_t* n;
    explicit Count(int64_t* c) : n(c) {}
    void operator()(const torch::autograd::Variable&) override { ++*n; }
  };
  for (auto& p : params)
    torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<Count>(&run.post_acc_calls));
  StepOutput r = ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, o);
  r.loss.backward();
  for (auto& p : params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  for (int64_t i = 0; i < f.opt.ttt_length; ++i) run.ploss.push_back(r.ploss[i].item<double>());
  for (auto& p : params) run.grads.push_back(p.grad().clone());
  f.model->set_checkpoint_layer(false);
  return run;
}

}  // namespace

TEST_CASE("activation checkpointing: same losses and gradients, one accumulation per parameter",
          "[model][ttt]") {
  for (auto impl : {AttentionImpl::kEfficient, AttentionImpl::kDense}) {
    INFO((impl == AttentionImpl::kEfficient ? "efficient" : "dense") << " attention");
    StepFixture f;
    f.opt.ttt_length = 4;  // the fixture's positions allow 4 steps; 3 cached steps at the last
    const CheckpointRun plain = checkpoint_run(f, false, impl);
    const CheckpointRun ckpt = checkpoint_run(f, true, impl);
    const int64_t n_params = static_cast<int64_t>(f.model->trainable_parameters().size());
    CHECK(plain.post_acc_calls == n_params);
    CHECK(ckpt.post_acc_calls == n_params);
    REQUIRE(ckpt.ploss.size() == plain.ploss.size());
    for (size_t i = 0; i < plain.ploss.size(); ++i) CHECK(ckpt.ploss[i] == plain.ploss[i]);
    for (size_t k = 0; k < plain.grads.size(); ++k) {
      INFO("parameter " << k);
      CHECK((ckpt.grads[k] - plain.grads[k]).abs().max().item<double>() <= 1e-14);
    }
  }
}

TEST_CASE("activation checkpointing: fp32 gradients are bit-identical; no graph without grad",
          "[model][ttt]") {
  StepFixture f;
  f.model->to(torch::kFloat);
  f.head = TargetHead(torch::randn({20, 8}), f.model->t2d);
  f.aux = f.aux.to(torch::kFloat);
  f.target_hidden = f.target_hidden.to(torch::kFloat);
  const CheckpointRun plain = checkpoint_run(f, false, AttentionImpl::kEfficient);
  const CheckpointRun ckpt = checkpoint_run(f, true, AttentionImpl::kEfficient);
  for (size_t k = 0; k < plain.grads.size(); ++k) {
    INFO("parameter " << k);
    CHECK(torch::equal(ckpt.grads[k], plain.grads[k]));
  }
  // The graph holds no node from inside the layer (SiLU of the MLP, softmax/attention) when
  // checkpointed: those activations are not kept; the checkpoint nodes stand for the layer.
  for (bool checkpoint : {false, true}) {
    INFO("checkpoint " << checkpoint);
    f.model->set_checkpoint_layer(checkpoint);
    LossOptions o = f.opt;
    o.recompute_loss = checkpoint;
    StepOutput r =
        ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, o);
    std::multiset<std::string> names;
    std::set<const torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> pending{r.loss.grad_fn().get()};
    while (!pending.empty()) {
      torch::autograd::Node* n = pending.back();
      pending.pop_back();
      if (!n || !seen.insert(n).second) continue;
      names.insert(n->name());
      for (const auto& edge : n->next_edges()) pending.push_back(edge.function.get());
    }
    const auto with = [&](const std::string& part) {
      int64_t c = 0;
      for (const auto& name : names) c += name.find(part) != std::string::npos;
      return c;
    };
    CHECK(with("SiluBackward") == (checkpoint ? 0 : f.opt.ttt_length));
    CHECK(with("CheckpointedLayer") == (checkpoint ? f.opt.ttt_length : 0));
    // With recompute_loss each step's loss is one node that holds only the step's logits (no
    // log_softmax output, no gathered target rows); without it, the plain composition.
    CHECK(with("WeightedSoftCrossEntropy") == (checkpoint ? f.opt.ttt_length : 0));
    CHECK(with("LogSoftmaxBackward") == (checkpoint ? 0 : f.opt.ttt_length));
  }
  // Evaluation (no grad mode) takes the plain path: nothing is saved for a backward.
  f.model->set_checkpoint_layer(true);
  torch::NoGradGuard g;
  StepOutput r =
      ttt_step(*f.model, f.head, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, f.opt);
  CHECK_FALSE(r.loss.requires_grad());
  CHECK(r.ploss[0].item<double>() == plain.ploss[0]);
}

TEST_CASE("loss rows: the recomputing loss node is bit-identical to the plain composition",
          "[model][ttt]") {
  // With recompute_loss the soft cross-entropy keeps only the logits for backward and
  // recomputes log_softmax there; written out with plain autograd ops it must give the same
  // bits (and so must the default path).
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO("model dtype " << dtype);
    StepFixture f;
    f.model->to(dtype);
    f.head = TargetHead(torch::randn({20, 8}), f.model->t2d);
    f.aux = f.aux.to(torch::kFloat);
    f.target_hidden = f.target_hidden.to(torch::kFloat);
    const int64_t T = f.opt.ttt_length, B = 2, S = 5;
    LossRows rows = LossRows::build(f.loss_mask, T, torch::kCPU);
    const auto params = f.model->trainable_parameters();

    f.model->zero_grad();
    RowTarget rt = f.head.compute_rows(f.target_hidden, rows.rows);
    at::Tensor h = f.model->project_aux(f.aux), want;
    DraftCache cache;
    std::vector<double> want_ploss;
    for (int64_t i = 0; i < T; ++i) {
      at::Tensor e = f.model->embed(shift_left(f.ids, i));
      at::Tensor out = f.model->decode(e, h, i, cache, f.mask, AttentionImpl::kEfficient);
      const at::Tensor& take = rows.target[static_cast<size_t>(i)];
      at::Tensor logits = f.model->logits(
          out.reshape({B * S, -1}).index_select(0, rows.draft[static_cast<size_t>(i)]));
      at::Tensor p = rt.target_p.index_select(0, take).to(torch::kFloat);
      at::Tensor pm = rt.in_draft.index_select(0, take).to(torch::kFloat);
      at::Tensor ce = -(p * logits.to(torch::kFloat).log_softmax(-1)).sum(-1);
      at::Tensor ploss = (pm * ce).sum() / static_cast<double>(B * S);
      want_ploss.push_back(ploss.item<double>());
      const double w = std::pow(f.opt.step_decay, static_cast<double>(i));
      want = want.defined() ? want + w * ploss : w * ploss;
      h = out;
    }
    (want / 1.0).backward();
    std::vector<at::Tensor> want_grads;
    for (auto& p : params) want_grads.push_back(p.grad().clone());

    for (bool recompute : {false, true}) {
      INFO("recompute_loss " << recompute);
      f.model->zero_grad();
      LossOptions o = f.opt;
      o.recompute_loss = recompute;
      StepOutput r =
          ttt_step(*f.model, f.head, rows, f.ids, f.mask, f.loss_mask, f.aux, f.target_hidden, o);
      r.loss.backward();
      CHECK(r.loss.item<double>() == (want / 1.0).item<double>());
      for (int64_t i = 0; i < T; ++i) CHECK(r.ploss[i].item<double>() == want_ploss[i]);
      CHECK(r.loss_tokens[0].item<double>() > 0);
      for (size_t k = 0; k < params.size(); ++k) {
        INFO("parameter " << k);
        CHECK(torch::equal(params[k].grad(), want_grads[k]));
      }
    }
  }
}

TEST_CASE("chain acceptance: the unroll's leading hits per anchor, against a brute-force count",
          "[model][ttt]") {
  // Longer samples than StepFixture's so chains of T = 3 fit, with a gap in the loss mask.
  const DraftConfig cfg = small_config(8, 2, 1, 4, 12, 20, 10);
  Eagle3Draft model{cfg};
  torch::manual_seed(5);
  model->to(torch::kDouble);
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.uniform_(-0.7, 0.7);
  }
  const int64_t B = 2, S = 9, T = 3, Vd = 10;
  at::Tensor ids = torch::randint(0, 20, {B, S}, torch::kLong);
  at::Tensor mask = torch::ones({B, S}, torch::kLong);
  mask[1].narrow(0, 7, 2).zero_();
  at::Tensor loss_mask = torch::tensor({0, 1, 1, 1, 1, 0, 1, 1, 0,   // runs of 4 and 2
                                        1, 1, 1, 1, 1, 1, 0, 0, 0},  // a run of 6
                                       torch::kLong)
                             .view({B, S});
  at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
  torch::NoGradGuard g;
  const auto logits = ttt_logits(*model, ids, mask, aux, T, AttentionImpl::kDense);
  // Target row t copies the argmax of step t % T at draft position t - t % T: the chain
  // anchored at a multiple of T hits every step (unless a position mask stops it), others
  // miss at once unless argmaxes coincide. position_mask zeroes a few rows.
  at::Tensor best = torch::zeros({B, S}, torch::kLong);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      best[b][t] = logits[t % T][b][t - t % T].argmax().item<int64_t>();
  TargetDistribution target;
  target.target_p = torch::full({B, S + T, Vd}, 0.01, torch::kFloat);
  target.target_p.narrow(1, 0, S).scatter_(2, best.unsqueeze(-1), 1.0);
  target.target_p /= target.target_p.sum(-1, true);
  target.position_mask = loss_mask.clone();
  target.position_mask[0][3] = 0;
  for (int64_t t : {int64_t{0}, int64_t{5}}) target.position_mask[1][t] = 0;

  // Brute force: anchor t0 needs loss positions t0..t0+T-1 in its sample; depth i is a hit when
  // step i's argmax at draft position t0 equals the target's best at t0 + i (position mask 1).
  double accepted = 0, anchors = 0, max_chain = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = 0; t0 + T <= S; ++t0) {
      bool full = true;
      for (int64_t i = 0; i < T; ++i) full = full && loss_mask[b][t0 + i].item<int64_t>() == 1;
      if (!full) continue;
      anchors += 1;
      int64_t n = 0;
      while (n < T && target.position_mask[b][t0 + n].item<int64_t>() == 1 &&
             logits[n][b][t0].argmax().item<int64_t>() == best[b][t0 + n].item<int64_t>())
        ++n;
      accepted += static_cast<double>(n);
      max_chain = std::max(max_chain, static_cast<double>(n));
    }
  REQUIRE(anchors == 2 + 4);  // the run of 4 gives 2 anchors, the run of 6 gives 4
  CHECK(max_chain >= 2);      // the anchor at position 3 of sample 1 (row 5 is masked)

  LossOptions opt;
  opt.ttt_length = T;
  opt.attention = AttentionImpl::kDense;
  StepOutput r = ttt_step(*model, target, ids, mask, loss_mask, aux, opt);
  CHECK(r.anchors.item<double>() == anchors);
  CHECK(r.accepted.item<double>() == accepted);

  // With T = 1 every loss row is an anchor and the chain is step 0's hit: accepted = correct_0.
  opt.ttt_length = 1;
  TargetDistribution one = target;
  one.target_p = target.target_p.narrow(1, 0, S + 1).contiguous();
  StepOutput r1 = ttt_step(*model, one, ids, mask, loss_mask, aux, opt);
  CHECK(r1.anchors.item<double>() == loss_mask.sum().item<double>());
  CHECK(r1.accepted.item<double>() == r1.correct[0].item<double>());
}
