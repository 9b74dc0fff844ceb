// fsdp-train's own CUDA kernels (kernels/fused.h, docs/model.md "Fused CUDA kernels") against
// the composite ops they replace: the soft cross-entropy forward and backward over many row
// counts, vocabulary sizes and dtypes; the TTT attention's diagonal merge forward and backward
// (GQA, head sizes that are and are not multiples of 32, 1..12 steps, padding, packing); a whole
// TTT step with --fused-cuda-kernels (loss, every step's loss, every gradient) in fp32 within
// 1e-6. The [cuda] cases skip without a GPU; the CPU cases check what a CPU run sees: the
// kernels decline CPU tensors, kFused attention on the CPU is the efficient path bit for bit.
#include <catch2/catch.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/fused.h"
#include "model/draft_model.h"
#include "model/ttt_attention.h"
#include "model/ttt_loss.h"
#include "support/random_draft.h"
#include "support/small_draft.h"
#include "support/torch_gpu.h"

using namespace fsdp::model;

namespace {

// max |a - b| relative to max(1, max |b|), in fp64 (on the tensors' device: only the result is
// copied).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble).to(x.device());
  if (y.numel() == 0) return 0.0;
  return (x - y).abs().max().item<double>() / std::max(1.0, y.abs().max().item<double>());
}

// The composite soft cross-entropy the kernel replaces (ttt_loss.cpp), rows [N].
at::Tensor composite_soft_ce(const at::Tensor& logits, const at::Tensor& target_p,
                             const at::Tensor& take) {
  const at::Tensor p = target_p.index_select(0, take).to(at::kFloat);
  return -(p * logits.to(at::kFloat).log_softmax(-1)).sum(-1);
}

// The soft cross-entropy's gradient d(g . loss)/dz in float64: the value both fp32 paths (the
// kernel and the composite ops) approximate.
at::Tensor soft_ce_grad_f64(const at::Tensor& logits, const at::Tensor& target_p,
                            const at::Tensor& take, const at::Tensor& g) {
  const at::Tensor z = logits.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor p = target_p.index_select(0, take).to(at::kDouble);
  const at::Tensor loss = -(p * z.log_softmax(-1)).sum(-1);
  return torch::autograd::grad({loss}, {z}, {g.to(at::kDouble)})[0];
}

// An fp32 gradient is exact when it is as close to the float64 value as the composite ops' own
// fp32 result is (within 2x), or within 1e-6 of it: over 32000+ logits of magnitude up to ~30 the
// composite's own fp32 rounding reaches 1.5e-6 relative (measured on an H200), so a fixed 1e-6
// between the two fp32 paths is not a bound either can meet.
void check_fp32_grad(const at::Tensor& got, const at::Tensor& composite, const at::Tensor& f64) {
  const double mine = rel_diff(got, f64), theirs = rel_diff(composite, f64);
  INFO("kernel vs float64 " << mine << ", composite vs float64 " << theirs);
  CHECK(mine <= std::max(1e-6, 2.0 * theirs));
}

// The keys and values of `steps` + 1 TTT steps, [B, nkv, S, d] each, requiring gradients.
struct Kv {
  std::vector<at::Tensor> keys, values;
};
Kv make_kv(int64_t B, int64_t nkv, int64_t S, int64_t d, int64_t steps,
           const torch::TensorOptions& opt) {
  Kv kv;
  for (int64_t j = 0; j <= steps; ++j) {
    kv.keys.push_back(torch::randn({B, nkv, S, d}, opt).requires_grad_(true));
    kv.values.push_back(torch::randn({B, nkv, S, d}, opt).requires_grad_(true));
  }
  return kv;
}

}  // namespace

TEST_CASE("fused kernels decline CPU tensors; kFused attention on the CPU is the efficient path",
          "[model][kernels]") {
  torch::manual_seed(3);
  const at::Tensor logits = torch::randn({4, 10});
  const at::Tensor target = torch::randn({6, 10}).softmax(-1);
  const at::Tensor take = torch::tensor({0, 2, 5, 1}, torch::kLong);
  CHECK_FALSE(fsdp::kernels::soft_ce_supported(logits, target));
  CHECK_FALSE(fsdp::kernels::ttt_merge_supported(torch::randn({1, 2, 3, 8}), 2));
  // Called anyway, the kernel refuses with an error rather than reading host memory.
  CHECK_THROWS_AS(fsdp::kernels::soft_ce_forward(logits, target, take), fsdp::Error);
  // The option's whole effect on a CPU run: none (the trainer refuses the flag there; the
  // model's fallback is the efficient path, bit for bit).
  const at::Tensor q = torch::randn({2, 4, 9, 16}).requires_grad_(true);
  Kv kv = make_kv(2, 2, 9, 16, 3, torch::TensorOptions());
  at::Tensor mask = torch::ones({2, 9}, torch::kLong);
  mask[1].narrow(0, 6, 3).zero_();
  const at::Tensor a = ttt_attention(q, kv.keys, kv.values, mask, 0.25, AttentionImpl::kFused);
  const at::Tensor b = ttt_attention(q, kv.keys, kv.values, mask, 0.25, AttentionImpl::kEfficient);
  CHECK(torch::equal(a, b));
}

TEST_CASE("cuda: fused soft cross-entropy matches the composite ops", "[cuda][model][kernels]") {
  TORCH_REQUIRE_GPU();
  torch::manual_seed(5);
  const auto dev = torch::kCUDA;
  for (const int64_t V : {1, 31, 1003, 32000}) {
    for (const int64_t N : {0, 1, 37, 300}) {
      for (auto dz : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        for (auto dp : {torch::kFloat, torch::kBFloat16}) {
          INFO("V " << V << ", N " << N << ", logits " << dz << ", target " << dp);
          const int64_t M = N + 5;
          // Targets whose rows sum to 1 and (the draft vocabulary's share of a target's mass)
          // to less; wide logits so the log-sum-exp's max matters.
          at::Tensor target =
              (torch::randn({M, V}, torch::TensorOptions().device(dev)) * 3).softmax(-1) *
              (torch::rand({M, 1}, torch::TensorOptions().device(dev)) * 0.5 + 0.5);
          target[0].fill_(1.0 / static_cast<double>(V));
          target = target.to(dp);
          const at::Tensor take =
              torch::randint(0, M, {N}, torch::TensorOptions().device(dev).dtype(torch::kLong));
          at::Tensor z = (torch::randn({N, V}, torch::TensorOptions().device(dev)) * 8)
                             .to(dz)
                             .requires_grad_(true);
          REQUIRE(fsdp::kernels::soft_ce_supported(z, target));
          const fsdp::kernels::SoftCe f = fsdp::kernels::soft_ce_forward(z.detach(), target, take);
          const at::Tensor want = composite_soft_ce(z, target, take);
          REQUIRE(f.loss.sizes() == want.sizes());
          // fp32 arithmetic on the same (rounded) inputs in both: the order of the sums differs.
          CHECK(rel_diff(f.loss, want) <= 1e-6);
          CHECK(rel_diff(f.psum, target.index_select(0, take).to(at::kFloat).sum(-1)) <= 1e-6);
          CHECK(rel_diff(f.row_max.to(at::kDouble) + f.log_sum.to(at::kDouble),
                         z.detach().to(at::kDouble).logsumexp(-1)) <= 1e-6);
          const at::Tensor g = torch::randn({N}, torch::TensorOptions().device(dev));
          const at::Tensor got = fsdp::kernels::soft_ce_backward(g, z.detach(), target, take,
                                                                 f.row_max, f.log_sum, f.psum);
          REQUIRE(got.scalar_type() == dz);
          if (N == 0) continue;
          const at::Tensor ref = torch::autograd::grad({want}, {z}, {g})[0];
          // fp32 logits: within fp32 rounding; bf16/fp16: the same fp32 value rounded once to the
          // logits' dtype, so at most one unit of it apart where the fp32 values straddle.
          if (dz == torch::kFloat) {
            check_fp32_grad(got, ref, soft_ce_grad_f64(z, target, take, g));
          } else {
            CHECK(rel_diff(got, ref) <= (dz == torch::kHalf ? 2e-3 : 1e-2));
          }
        }
      }
    }
  }
  // A strided logits view (rows of a wider buffer) reads the right elements.
  at::Tensor wide = torch::randn({7, 50}, torch::TensorOptions().device(dev));
  const at::Tensor z = wide.narrow(1, 3, 40);
  const at::Tensor target = torch::randn({7, 40}, torch::TensorOptions().device(dev)).softmax(-1);
  const at::Tensor take = torch::arange(7, torch::TensorOptions().device(dev).dtype(torch::kLong));
  CHECK(rel_diff(fsdp::kernels::soft_ce_forward(z, target, take).loss,
                 composite_soft_ce(z, target, take)) <= 1e-6);
}

// The draft vocabularies drafts are trained with (Llama 3 32000, Qwen 151936, Gemma 3 262144):
// another trainer's fused loss failed above 131072 (a launch dimension sized by the vocabulary),
// so each real size runs, and at the largest the logits hold more than 2^31 elements (8200 rows
// x 262144, bf16) so that 32-bit offsets anywhere in the kernels would show in the last rows.
TEST_CASE("cuda: fused soft cross-entropy at the real draft vocabularies",
          "[cuda][model][kernels]") {
  TORCH_REQUIRE_GPU();
  torch::manual_seed(11);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  struct Case {
    int64_t V, N;
    at::ScalarType dz;
  };
  for (const Case c : {Case{32000, 300, torch::kFloat}, Case{151936, 300, torch::kFloat},
                       Case{262144, 300, torch::kFloat}, Case{151936, 300, torch::kBFloat16},
                       Case{262144, 8200, torch::kBFloat16}}) {
    INFO("V " << c.V << ", N " << c.N << ", logits " << c.dz);
    const at::Tensor target = (torch::randn({c.N, c.V}, cuda) * 3).softmax(-1).to(torch::kBFloat16);
    const at::Tensor take = torch::arange(c.N, cuda.dtype(torch::kLong)).flip(0);
    const at::Tensor z = (torch::randn({c.N, c.V}, cuda) * 8).to(c.dz);
    const fsdp::kernels::SoftCe f = fsdp::kernels::soft_ce_forward(z, target, take);
    const at::Tensor g = torch::randn({c.N}, cuda);
    const at::Tensor grad =
        fsdp::kernels::soft_ce_backward(g, z, target, take, f.row_max, f.log_sum, f.psum);
    // The reference in fp32 on the first, a middle and the last 300 rows (its fp32 copies of
    // the whole largest buffer would need 17 GiB): the kernels' rows are independent.
    for (const int64_t r0 : {int64_t{0}, c.N / 2, c.N - 300}) {
      const int64_t n = std::min<int64_t>(300, c.N - r0);
      const at::Tensor zr = z.narrow(0, r0, n).detach().requires_grad_(true);
      const at::Tensor want = composite_soft_ce(zr, target, take.narrow(0, r0, n));
      CHECK(rel_diff(f.loss.narrow(0, r0, n), want) <= 1e-6);
      const at::Tensor gr = g.narrow(0, r0, n);
      const at::Tensor ref = torch::autograd::grad({want}, {zr}, {gr})[0];
      if (c.dz == torch::kFloat) {
        check_fp32_grad(grad.narrow(0, r0, n), ref,
                        soft_ce_grad_f64(zr, target, take.narrow(0, r0, n), gr));
      } else {
        CHECK(rel_diff(grad.narrow(0, r0, n), ref) <= 1e-2);
      }
    }
  }
}

TEST_CASE("cuda: fused TTT attention merge matches the composite merge", "[cuda][model][kernels]") {
  TORCH_REQUIRE_GPU();
  torch::manual_seed(9);
  struct Shape {
    int64_t B, nh, nkv, S, d, steps;
  };
  for (const Shape& s :
       {Shape{2, 8, 2, 300, 64, 4}, Shape{1, 4, 4, 129, 128, 6}, Shape{2, 6, 2, 65, 80, 1},
        Shape{1, 4, 1, 33, 128, 12}, Shape{1, 8, 8, 17, 256, 2}}) {
    for (auto dt : {torch::kFloat, torch::kBFloat16}) {
      INFO("B " << s.B << " nh " << s.nh << " nkv " << s.nkv << " S " << s.S << " d " << s.d
                << " steps " << s.steps << " " << dt);
      auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      at::Tensor q = torch::randn({s.B, s.nh, s.S, s.d}, opt).requires_grad_(true);
      REQUIRE(fsdp::kernels::ttt_merge_supported(q, s.steps));
      Kv kv = make_kv(s.B, s.nkv, s.S, s.d, s.steps, opt);
      at::Tensor mask =
          torch::ones({s.B, s.S}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
      if (s.B > 1) mask[1].narrow(0, s.S / 2, s.S - s.S / 2).fill_(0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
      const at::Tensor fused =
          ttt_attention(q, kv.keys, kv.values, mask, scale, AttentionImpl::kFused);
      const at::Tensor plain =
          ttt_attention(q, kv.keys, kv.values, mask, scale, AttentionImpl::kEfficient);
      const double tol = dt == torch::kFloat ? 1e-6 : 1e-2;
      CHECK(rel_diff(fused, plain) <= tol);
      const at::Tensor g = torch::randn_like(plain);
      std::vector<at::Tensor> wrt{q};
      for (int64_t j = 0; j <= s.steps; ++j) {
        wrt.push_back(kv.keys[static_cast<size_t>(j)]);
        wrt.push_back(kv.values[static_cast<size_t>(j)]);
      }
      const auto gf = torch::autograd::grad({fused}, wrt, {g});
      const auto gp = torch::autograd::grad({plain}, wrt, {g});
      for (size_t k = 0; k < wrt.size(); ++k) {
        INFO("gradient " << k << " (0: q, then key/value of each step)");
        REQUIRE(gf[k].scalar_type() == dt);
        CHECK(rel_diff(gf[k], gp[k]) <= (dt == torch::kFloat ? 1e-6 : 3e-2));
      }
    }
  }
  // Packed documents: the merge is per position, the causal part per document.
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  at::Tensor q = torch::randn({1, 4, 40, 64}, opt).requires_grad_(true);
  Kv kv = make_kv(1, 2, 40, 64, 3, opt);
  const SeqLayout packed(torch::ones({1, 40}, opt.dtype(torch::kLong)), {1, 25, 14});
  const at::Tensor fused =
      ttt_attention(q, kv.keys, kv.values, packed, 0.125, AttentionImpl::kFused);
  const at::Tensor dense =
      ttt_attention(q, kv.keys, kv.values, packed, 0.125, AttentionImpl::kDense);
  CHECK(rel_diff(fused, dense) <= 1e-5);
  const at::Tensor g = torch::randn_like(dense);
  const auto gf = torch::autograd::grad({fused}, {q, kv.keys[2], kv.values[3]}, {g});
  const auto gd = torch::autograd::grad({dense}, {q, kv.keys[2], kv.values[3]}, {g});
  for (size_t k = 0; k < gf.size(); ++k) CHECK(rel_diff(gf[k], gd[k]) <= 1e-5);
}

TEST_CASE("cuda: a TTT step with the fused kernels equals the composite step in fp32",
          "[cuda][model][kernels]") {
  TORCH_REQUIRE_GPU();
  DraftConfig c = fsdp::testing::small_draft();  // GQA
  c.max_position_embeddings = 32;
  c.validate();
  torch::manual_seed(13);
  Eagle3Draft m(c);
  fsdp::testing::randomise_draft(m);
  m->to(torch::kCUDA);
  const int64_t B = 2, S = 13, T = 7;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const at::Tensor ids = torch::randint(0, c.vocab_size, {B, S}, cuda.dtype(torch::kLong));
  at::Tensor mask = torch::ones({B, S}, cuda.dtype(torch::kLong));
  mask[1].narrow(0, 9, 4).zero_();
  at::Tensor loss_mask = mask.clone();
  loss_mask[0].narrow(0, 0, 3).zero_();
  const at::Tensor aux = torch::randn({B, S, c.fc_in_features()}, cuda) * 2;
  TargetDistribution target;
  target.target_p = (torch::randn({B, S + T, c.draft_vocab()}, cuda) * 2).softmax(-1);
  target.position_mask = loss_mask * torch::rand({B, S}, cuda).gt(0.2).to(torch::kLong);
  target.draft_mass = torch::rand({B, S}, cuda) * 0.5 + 0.5;

  struct Variant {
    const char* name;
    LossOptions o;
  };
  LossOptions base;
  base.ttt_length = T;
  base.head_chunk_rows = -1;
  LossOptions chunked = base;
  chunked.head_chunk_rows = 5;
  LossOptions lambda = base;
  lambda.lk = LossOptions::LK::kLambda;
  LossOptions recompute = base;
  recompute.recompute_loss = true;
  for (const Variant& v : {Variant{"plain", base}, Variant{"chunked head", chunked},
                           Variant{"LK lambda", lambda}, Variant{"recompute", recompute}}) {
    INFO(v.name);
    auto run = [&](bool fused) {
      LossOptions o = v.o;
      o.fused_kernels = fused;
      o.attention = fused ? AttentionImpl::kFused : AttentionImpl::kEfficient;
      m->zero_grad();
      StepOutput out = ttt_step(*m, target, ids, mask, loss_mask, aux, o);
      out.loss.backward();
      std::vector<at::Tensor> grads;
      for (const auto& p : m->trainable_parameters()) grads.push_back(p.grad().clone());
      return std::make_pair(out, grads);
    };
    const auto [fo, fg] = run(true);
    const auto [po, pg] = run(false);
    CHECK(rel_diff(fo.loss, po.loss) <= 1e-6);
    CHECK(rel_diff(fo.ploss, po.ploss) <= 1e-6);
    REQUIRE(fg.size() == pg.size());
    for (size_t k = 0; k < fg.size(); ++k) {
      INFO("parameter " << k);
      CHECK(rel_diff(fg[k], pg[k]) <= 1e-6);
    }
  }
}

TEST_CASE("weight gradients summed inside the GEMMs, without a sharding engine",
          "[model][kernels]") {
  // No engine: the first backward finds no .grad and returns every use's gradient as autograd
  // does; a second backward accumulates into the existing .grad in place. Both equal the plain
  // path's .grad within 1e-6 (fp32, CPU), and the second backward took the in-place path.
  DraftConfig c = fsdp::testing::small_draft();
  c.max_position_embeddings = 32;
  c.validate();
  const int64_t B = 2, S = 9, T = 4;
  torch::manual_seed(17);
  const at::Tensor ids = torch::randint(0, c.vocab_size, {B, S}, torch::kLong);
  const at::Tensor mask = torch::ones({B, S}, torch::kLong);
  const at::Tensor aux = torch::randn({B, S, c.fc_in_features()});
  TargetDistribution target;
  target.target_p = torch::randn({B, S + T, c.draft_vocab()}).softmax(-1);
  target.position_mask = mask.clone();
  LossOptions o;
  o.ttt_length = T;
  std::vector<std::vector<at::Tensor>> grads(2);
  int64_t adds = 0;
  for (int in_place = 0; in_place < 2; ++in_place) {
    torch::manual_seed(3);
    Eagle3Draft m(c);
    fsdp::testing::randomise_draft(m);
    m->set_weight_grad_in_place(in_place == 1);
    const int64_t before = linear_grad_in_place_adds();
    for (int pass = 0; pass < 2; ++pass)
      ttt_step(*m, target, ids, mask, mask, aux, o).loss.backward();
    adds = linear_grad_in_place_adds() - before;
    for (const auto& p : m->trainable_parameters()) grads[in_place].push_back(p.grad().clone());
  }
  // The second pass: 7 projections x (T uses - the last); the first found no .grad.
  CHECK(adds == 7 * (T - 1));
  REQUIRE(grads[0].size() == grads[1].size());
  for (size_t k = 0; k < grads[0].size(); ++k) {
    INFO("parameter " << k);
    CHECK(rel_diff(grads[1][k], grads[0][k]) <= 1e-6);
  }
}
