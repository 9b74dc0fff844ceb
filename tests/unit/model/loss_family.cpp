// The objectives of --loss-fn (docs/model.md "Loss functions"): each per-row term against a
// float64 reference written element by element from its definition, its gradient against finite
// differences, the step's loss through the model with a weighted mix (finite differences on the
// parameters), and the spec parser.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/draft_model.h"
#include "model/ttt_loss.h"

using namespace fsdp::model;

namespace {

const LossTerm kAll[] = {LossTerm::kSoftCE, LossTerm::kKL,      LossTerm::kReverseKL,
                         LossTerm::kJSD,    LossTerm::kTV,      LossTerm::kNLA,
                         LossTerm::kHardCE, LossTerm::kLKHybrid};

// One row, from the definitions, with plain loops.
double reference(LossTerm t, const std::vector<double>& z, const std::vector<double>& p) {
  const size_t n = z.size();
  double mx = *std::max_element(z.begin(), z.end()), sum = 0;
  for (double v : z) sum += std::exp(v - mx);
  std::vector<double> q(n), logq(n);
  for (size_t k = 0; k < n; ++k) {
    logq[k] = z[k] - mx - std::log(sum);
    q[k] = std::exp(logq[k]);
  }
  double out = 0, overlap = 0, kl = 0;
  for (size_t k = 0; k < n; ++k) {
    overlap += std::min(p[k], q[k]);
    if (p[k] > 0) kl += p[k] * (std::log(p[k]) - logq[k]);
  }
  switch (t) {
    case LossTerm::kSoftCE:
      for (size_t k = 0; k < n; ++k) out -= p[k] * logq[k];
      return out;
    case LossTerm::kKL:
      return kl;
    case LossTerm::kReverseKL:
      for (size_t k = 0; k < n; ++k) out += q[k] * (logq[k] - std::log(p[k]));
      return out;
    case LossTerm::kJSD:
      for (size_t k = 0; k < n; ++k) {
        const double m = (p[k] + q[k]) / 2;
        out += 0.5 * (p[k] * std::log(p[k] / m) + q[k] * std::log(q[k] / m));
      }
      return out;
    case LossTerm::kTV:
      for (size_t k = 0; k < n; ++k) out += 0.5 * std::abs(p[k] - q[k]);
      return out;  // = 1 - overlap for two distributions
    case LossTerm::kNLA:
      return -std::log(std::max(overlap, 1e-5));
    case LossTerm::kHardCE:
      return -logq[static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin())];
    case LossTerm::kLKHybrid: {
      const double w = std::exp(-3.0 * overlap);
      return w * kl + (1 - w) * (1 - overlap);
    }
  }
  return NAN;
}

// H 8, 2 heads of 4 over 1 KV head, I 12, V 20, Vd 10: small enough for finite differences.
DraftConfig tiny_config() {
  DraftConfig c;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 12;
  c.vocab_size = 20;
  c.draft_vocab_size = 10;
  c.max_position_embeddings = 16;
  c.validate();
  return c;
}

std::vector<double> vec(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

}  // namespace

TEST_CASE("loss family: every term equals its definition, gradients match finite differences",
          "[model][loss]") {
  torch::manual_seed(4);
  const int64_t N = 5, V = 7;
  at::Tensor z = torch::randn({N, V}, torch::kDouble) * 2;
  at::Tensor p = (torch::randn({N, V}, torch::kDouble) * 2).softmax(-1);
  for (LossTerm t : kAll) {
    INFO(loss_term_name(t));
    at::Tensor zz = z.clone().requires_grad_(true);
    at::Tensor got = row_loss(t, zz, p);
    REQUIRE(got.sizes() == at::IntArrayRef({N}));
    for (int64_t r = 0; r < N; ++r)
      CHECK(got[r].item<double>() == Approx(reference(t, vec(z[r]), vec(p[r]))).epsilon(1e-12));
    got.sum().backward();
    const double h = 1e-6;
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t k : {int64_t{0}, V / 2, V - 1}) {
        std::vector<double> up = vec(z[r]), down = vec(z[r]);
        up[k] += h;
        down[k] -= h;
        const double fd = (reference(t, up, vec(p[r])) - reference(t, down, vec(p[r]))) / (2 * h);
        // lk_hybrid's weight is held constant in its gradient (a stop-gradient), as in
        // speculators: finite differences see it move, so compare without it.
        if (t == LossTerm::kLKHybrid) continue;
        CHECK(zz.grad()[r][k].item<double>() == Approx(fd).margin(1e-7));
      }
    }
  }
}

TEST_CASE("loss family: the step with a mix, through the model (finite differences)",
          "[model][loss]") {
  const DraftConfig c = tiny_config();
  torch::manual_seed(6);
  Eagle3Draft m(c);
  m->to(torch::kDouble);
  at::Tensor ids = torch::randint(0, 20, {2, 5}, torch::kLong);
  at::Tensor mask = torch::ones({2, 5}, torch::kLong);
  at::Tensor aux = torch::randn({2, 5, 24}, torch::kDouble);
  TargetDistribution target;
  target.target_p = torch::rand({2, 5 + 3, 10}, torch::kDouble);
  target.target_p /= target.target_p.sum(-1, true);
  target.position_mask = mask.clone();
  LossOptions plain;
  plain.ttt_length = 3;
  LossOptions mix = plain;
  mix.loss_terms = parse_loss_spec(R"({"kl_div": 0.5, "tv": 0.3, "jsd": 0.2, "rkl": 0.1})");
  auto loss = [&](const LossOptions& o) {
    return ttt_step(*m, target, ids, mask, mask, aux, o).loss;
  };
  // soft_ce through the mix path is the default path's value, bit for bit.
  LossOptions soft = plain;
  soft.loss_terms = {{LossTerm::kSoftCE, 1.0}};
  {
    torch::NoGradGuard g;
    CHECK(loss(soft).item<double>() == loss(plain).item<double>());
  }
  // kl_div = soft_ce minus p's entropy: another value, the same gradients.
  LossOptions kl = plain;
  kl.loss_terms = {{LossTerm::kKL, 1.0}};
  std::vector<at::Tensor> g_ce, g_kl;
  m->zero_grad();
  loss(plain).backward();
  for (auto& p : m->trainable_parameters()) g_ce.push_back(p.grad().clone());
  m->zero_grad();
  const double kl_value = loss(kl).item<double>();
  loss(kl).backward();
  for (auto& p : m->trainable_parameters()) g_kl.push_back(p.grad().clone());
  for (size_t k = 0; k < g_ce.size(); ++k)
    CHECK((g_ce[k] - g_kl[k]).abs().max().item<double>() < 1e-12);
  {
    torch::NoGradGuard g;
    CHECK(std::abs(kl_value - loss(plain).item<double>()) > 1e-3);
  }
  // The mix: autograd against central differences on a few weights of every parameter.
  m->zero_grad();
  loss(mix).backward();
  int checked = 0;
  for (const auto& named : m->named_parameters()) {
    at::Tensor p = named.value();
    if (!p.requires_grad()) continue;
    at::Tensor flat = p.data().view(-1), grad = p.grad().view(-1);
    for (int64_t idx : {int64_t{0}, flat.numel() - 1}) {
      torch::NoGradGuard g;
      const double orig = flat[idx].item<double>(), h = 1e-6;
      flat[idx] = orig + h;
      const double up = loss(mix).item<double>();
      flat[idx] = orig - h;
      const double down = loss(mix).item<double>();
      flat[idx] = orig;
      INFO(named.key() << "[" << idx << "]");
      CHECK(grad[idx].item<double>() == Approx((up - down) / (2 * h)).margin(1e-7));
      ++checked;
    }
  }
  CHECK(checked == 2 * static_cast<int>(m->trainable_parameters().size()));
}

TEST_CASE("loss family: the spec parser", "[model][loss]") {
  const auto one = parse_loss_spec("soft_ce");
  REQUIRE(one.size() == 1);
  CHECK(one[0].first == LossTerm::kSoftCE);
  CHECK(one[0].second == 1.0);
  const auto mix = parse_loss_spec(R"({"ce": 0.1, "tv": 0.9})");
  REQUIRE(mix.size() == 2);
  CHECK(((mix[0].first == LossTerm::kHardCE && mix[1].first == LossTerm::kTV) ||
         (mix[1].first == LossTerm::kHardCE && mix[0].first == LossTerm::kTV)));
  for (const char* bad :
       {"kl", R"({"kl_div": -1})", R"({"kl_div": 0})", R"({"kl_div": "a"})", "{not json"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_loss_spec(bad), fsdp::UsageError);
  }
  CHECK_THROWS_WITH(parse_loss_spec("kl"), Catch::Contains("kl_div"));
}

TEST_CASE("LK losses (SpecForge's lambda and alpha): values from the definition, gradients",
          "[model][loss]") {
  const DraftConfig c = tiny_config();
  torch::manual_seed(8);
  Eagle3Draft m(c);
  m->to(torch::kDouble);
  const int64_t B = 2, S = 5, T = 3;
  at::Tensor ids = torch::randint(0, 20, {B, S}, torch::kLong);
  at::Tensor mask = torch::ones({B, S}, torch::kLong);
  at::Tensor aux = torch::randn({B, S, 24}, torch::kDouble);
  TargetDistribution target;
  target.target_p = torch::rand({B, S + T, 10}, torch::kDouble);
  target.target_p /= target.target_p.sum(-1, true);
  target.position_mask = torch::tensor({1, 1, 0, 1, 1, 0, 1, 1, 1, 1}, torch::kLong).view({B, S});
  target.draft_mass = torch::rand({B, S}, torch::kDouble) * 0.5 + 0.5;
  for (auto lk : {LossOptions::LK::kLambda, LossOptions::LK::kAlpha}) {
    INFO((lk == LossOptions::LK::kLambda ? "lambda" : "alpha"));
    LossOptions o;
    o.ttt_length = T;
    o.lk = lk;
    o.kl_scale = 0.7;
    o.kl_decay = 1.3;
    // The definition on the dense logits: step i pairs draft position u with target u + i.
    double want = 0;
    {
      torch::NoGradGuard g;
      const auto logits = ttt_logits(*m, ids, mask, aux, T, AttentionImpl::kDense);
      for (int64_t i = 0; i < T; ++i) {
        double ce = 0, sum_m = 0, sum_a = 0, sum_loga = 0;
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t u = 0; u + i < S; ++u) {
            const double w = target.position_mask[b][u + i].item<double>();
            const at::Tensor p = target.target_p[b][u + i];
            const at::Tensor q = logits[static_cast<size_t>(i)][b][u].softmax(-1);
            const double a = at::minimum(p * target.draft_mass[b][u + i], q).sum().item<double>();
            ce += w * -(p * q.log()).sum().item<double>();
            sum_m += w;
            sum_a += w * a;
            sum_loga += w * std::log(a);
          }
        }
        const double ploss = ce / (B * S), mean_a = sum_a / std::max(sum_m, 1e-8);
        double loss_i;
        if (lk == LossOptions::LK::kAlpha) {
          loss_i = -sum_loga / std::max(sum_m, 1e-8);
        } else {
          const double wkl = 0.7 * std::exp(-1.3 * mean_a);
          loss_i = wkl * ploss + (1 - wkl) * (1 - mean_a);
        }
        want += std::pow(0.8, static_cast<double>(i)) * loss_i;
      }
    }
    m->zero_grad();
    StepOutput r = ttt_step(*m, target, ids, mask, mask, aux, o);
    CHECK(r.loss.item<double>() == Approx(want).epsilon(1e-12));
    r.loss.backward();
    // Gradients: finite differences see lambda's weight move, which the objective holds constant
    // (SpecForge detaches it); alpha has no such term and is checked directly.
    if (lk != LossOptions::LK::kAlpha) continue;
    for (const auto& named : m->named_parameters()) {
      at::Tensor p = named.value();
      if (!p.requires_grad()) continue;
      at::Tensor flat = p.data().view(-1), grad = p.grad().view(-1);
      torch::NoGradGuard g;
      const double orig = flat[0].item<double>(), h = 1e-6;
      flat[0] = orig + h;
      const double up = ttt_step(*m, target, ids, mask, mask, aux, o).loss.item<double>();
      flat[0] = orig - h;
      const double down = ttt_step(*m, target, ids, mask, mask, aux, o).loss.item<double>();
      flat[0] = orig;
      INFO(named.key());
      CHECK(grad[0].item<double>() == Approx((up - down) / (2 * h)).margin(1e-7));
    }
  }
}

TEST_CASE("LK: the target head's draft-vocabulary mass equals the full softmax's",
          "[model][loss]") {
  torch::manual_seed(12);
  const int64_t V = 300, H = 8;
  at::Tensor w = torch::randn({V, H});
  at::Tensor t2d = torch::zeros({V}, torch::kBool);
  t2d.index_put_({torch::randperm(V).narrow(0, 0, 40)}, true);
  TargetHead head(w, t2d);
  at::Tensor hidden = torch::randn({2, 6, H}) * 2;
  at::Tensor rows = torch::arange(12, torch::kLong);
  for (int64_t tile : {int64_t{0}, int64_t{64}}) {
    INFO("tile " << tile);
    const RowTarget rt = head.compute_rows(hidden, rows, TargetImpl::kTiled, tile, true);
    const at::Tensor full =
        at::matmul(hidden.reshape({12, H}).to(at::kDouble), w.to(at::kDouble).t()).softmax(-1);
    const at::Tensor want = full.index({at::indexing::Slice(), t2d}).sum(-1);
    CHECK((rt.draft_mass.to(at::kDouble) - want).abs().max().item<double>() < 1e-5);
    CHECK_FALSE(head.compute_rows(hidden, rows, TargetImpl::kTiled, tile).draft_mass.defined());
  }
}
