// The kernels' own source (lib/kernels/*.cuh) run on host threads (kernels/emulation.h: a block's
// threads as std::threads, barriers for __syncthreads / __syncwarp, shuffles through a per-warp
// exchange) against the composite ops on the CPU: what can be checked of the kernels without a
// GPU (their indexing, reductions, bounds and formulas; not the hardware's scheduling). The soft
// cross-entropy forward and backward for fp32/bf16/fp16 logits and fp32/bf16 targets; the TTT
// merge forward and backward against the dense attention's values and autograd gradients (fp32
// within 1e-6; GQA, a head size that is not a multiple of 32, several steps). The [cuda] cases
// in tests/unit/model/fused_kernels.cpp run the compiled kernels on a GPU.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/ttt_attention.h"

#if defined(FSDP_KERNEL_EMULATION) && __has_include(<cuda_bf16.h>)
#include "kernels/soft_ce.cuh"
#include "kernels/ttt_merge.cuh"
#define HAVE_EMULATION 1
#else
#define HAVE_EMULATION 0
#endif

namespace {

[[maybe_unused]] double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).abs().max().item<double>() / std::max(1.0, y.abs().max().item<double>());
}

#if HAVE_EMULATION
namespace emu = fsdp::kernels::emu;
namespace dev = fsdp::kernels::device;
using fsdp::kernels::launch::MergeShape;
using fsdp::kernels::launch::Strides;

// The kernels' storage type of a LibTorch dtype.
template <class F>
void with_storage(c10::ScalarType t, F&& f) {
  if (t == at::kFloat) {
    f(float{});
  } else if (t == at::kBFloat16) {
    f(__nv_bfloat16{});
  } else {
    f(__half{});
  }
}
template <class T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}
#endif

}  // namespace

TEST_CASE("kernel emulation: soft cross-entropy equals the composite ops", "[kernels]") {
#if !HAVE_EMULATION
  WARN("skipped: built without the CUDA headers the kernels' source needs");
#else
  torch::manual_seed(4);
  for (const int64_t V : {1, 37, 1003, 32000}) {
    for (auto dz : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto dp : {at::kFloat, at::kBFloat16}) {
        // Every dtype pair at one size; the smaller sizes in fp32 (each launch starts 512 threads
        // per row here).
        if (V != 1003 && (dz != at::kFloat || dp != at::kFloat)) continue;
        if (V == 32000 && dp != at::kFloat) continue;
        INFO("V " << V << ", logits " << dz << ", target " << dp);
        const int64_t N = 5, M = 7;
        const at::Tensor target =
            ((torch::randn({M, V}) * 3).softmax(-1) * (torch::rand({M, 1}) * 0.5 + 0.5)).to(dp);
        const at::Tensor take = torch::tensor({6, 0, 3, 3, 1}, torch::kLong);
        const at::Tensor z = (torch::randn({N, V}) * 8).to(dz);
        at::Tensor loss = torch::empty({N}), row_max = torch::empty({N}),
                   log_sum = torch::empty({N}), psum = torch::empty({N});
        at::Tensor grad_z = torch::empty({N, V}, z.options());
        const at::Tensor g = torch::randn({N});
        with_storage(dz, [&](auto z0) {
          using Z = decltype(z0);
          with_storage(dp, [&](auto p0) {
            using P = decltype(p0);
            emu::launch(N, dev::kThreads, 0, dev::soft_ce_forward_kernel<Z, P>, ptr<const Z>(z), V,
                        ptr<const P>(target), V, take.data_ptr<int64_t>(), V,
                        loss.data_ptr<float>(), row_max.data_ptr<float>(),
                        log_sum.data_ptr<float>(), psum.data_ptr<float>());
            emu::launch(N, dev::kThreads, 0, dev::soft_ce_backward_kernel<Z, P>,
                        g.data_ptr<float>(), ptr<const Z>(z), V, ptr<const P>(target), V,
                        take.data_ptr<int64_t>(), row_max.data_ptr<float>(),
                        log_sum.data_ptr<float>(), psum.data_ptr<float>(), V, ptr<Z>(grad_z));
          });
        });
        const at::Tensor zz = z.to(at::kFloat).requires_grad_(true);
        const at::Tensor p = target.index_select(0, take).to(at::kFloat);
        const at::Tensor want = -(p * zz.log_softmax(-1)).sum(-1);
        CHECK(rel_diff(loss, want) <= 1e-6);
        CHECK(rel_diff(row_max.to(at::kDouble) + log_sum.to(at::kDouble),
                       zz.detach().to(at::kDouble).logsumexp(-1)) <= 1e-6);
        CHECK(rel_diff(psum, p.sum(-1)) <= 1e-6);
        const at::Tensor ref = torch::autograd::grad({want}, {zz}, {g})[0].to(dz);
        if (dz == at::kFloat) {
          // fp32: as close to the float64 gradient as the composite's own fp32 result (within 2x),
          // or within 1e-6 of it.
          const at::Tensor z64 = z.to(at::kDouble).requires_grad_(true);
          const at::Tensor l64 = -(p.to(at::kDouble) * z64.log_softmax(-1)).sum(-1);
          const at::Tensor g64 = torch::autograd::grad({l64}, {z64}, {g.to(at::kDouble)})[0];
          const double mine = rel_diff(grad_z, g64), theirs = rel_diff(ref, g64);
          INFO("kernel vs float64 " << mine << ", composite vs float64 " << theirs);
          CHECK(mine <= std::max(1e-6, 2.0 * theirs));
        } else {
          // bf16/fp16: the same fp32 value rounded once to the dtype.
          CHECK(rel_diff(grad_z, ref) <= 1e-2);
        }
      }
    }
  }
#endif
}

TEST_CASE("kernel emulation: the TTT attention merge equals the dense attention", "[kernels]") {
#if !HAVE_EMULATION
  WARN("skipped: built without the CUDA headers the kernels' source needs");
#else
  torch::manual_seed(8);
  struct Shape {
    int64_t B, nh, nkv, S, d, steps;
  };
  for (const Shape& s :
       {Shape{2, 4, 2, 9, 40, 3}, Shape{1, 2, 1, 5, 128, 1}, Shape{1, 3, 3, 4, 64, 6}}) {
    INFO("B " << s.B << " nh " << s.nh << " nkv " << s.nkv << " S " << s.S << " d " << s.d
              << " steps " << s.steps);
    const int64_t G = s.nh / s.nkv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    auto f64 = torch::TensorOptions().dtype(at::kDouble);
    const at::Tensor q = torch::randn({s.B, s.nh, s.S, s.d}, f64).requires_grad_(true);
    std::vector<at::Tensor> keys, values;
    for (int64_t j = 0; j <= s.steps; ++j) {
      keys.push_back(torch::randn({s.B, s.nkv, s.S, s.d}, f64).requires_grad_(true));
      values.push_back(torch::randn({s.B, s.nkv, s.S, s.d}, f64).requires_grad_(true));
    }
    // The reference: the dense attention in float64, its gradients by autograd.
    const at::Tensor mask = torch::ones({s.B, s.S}, torch::kLong);
    const at::Tensor dense = fsdp::model::ttt_attention_dense(q, keys, values, mask, scale);
    const at::Tensor g = torch::randn_like(dense);
    std::vector<at::Tensor> wrt{q};
    for (int64_t j = 1; j <= s.steps; ++j) {
      wrt.push_back(keys[static_cast<size_t>(j)]);
      wrt.push_back(values[static_cast<size_t>(j)]);
    }
    const auto ref = torch::autograd::grad({dense}, wrt, {g});
    // The causal part's output and log-sum-exp, and (for dq) its backward with the merged
    // log-sum-exp, in float64; the kernels get them rounded to fp32 as a kernel would give them.
    const at::Tensor k0 = keys[0].detach().repeat_interleave(G, 1);
    const at::Tensor v0 = values[0].detach().repeat_interleave(G, 1);
    const at::Tensor causal = torch::ones({s.S, s.S}, torch::kBool).tril();
    const at::Tensor sc =
        (at::matmul(q.detach(), k0.transpose(-1, -2)) * scale).masked_fill(~causal, -INFINITY);
    const at::Tensor lse_c = sc.logsumexp(-1);
    const at::Tensor c_out = at::matmul((sc - lse_c.unsqueeze(-1)).exp(), v0);
    std::vector<at::Tensor> ks(keys.begin() + 1, keys.end()), vs(values.begin() + 1, values.end());
    for (auto& t : ks) t = t.detach();
    for (auto& t : vs) t = t.detach();
    const at::Tensor kd = at::stack(ks, 3).to(at::kFloat).contiguous();
    const at::Tensor vd = at::stack(vs, 3).to(at::kFloat).contiguous();
    const at::Tensor q32 = q.detach().to(at::kFloat).contiguous();
    const at::Tensor c32 = c_out.to(at::kFloat).contiguous();
    const at::Tensor lse32 = lse_c.to(at::kFloat).contiguous();
    MergeShape sh;
    sh.B = s.B;
    sh.nkv = s.nkv;
    sh.groups = G;
    sh.S = s.S;
    sh.steps = s.steps;
    sh.d = s.d;
    const Strides st{s.nh * s.S * s.d, s.S * s.d, s.d};
    const unsigned blocks =
        static_cast<unsigned>((s.B * s.nkv * s.S + dev::kWarpsPerBlock - 1) / dev::kWarpsPerBlock);
    at::Tensor out = torch::empty_like(q32), total = torch::empty({s.B, s.nh, s.S});
    emu::launch(blocks, 32 * dev::kWarpsPerBlock, 0, dev::merge_forward_kernel<float>, sh,
                ptr<const float>(q32), st, ptr<const float>(c32), st, lse32.data_ptr<float>(),
                ptr<const float>(kd), ptr<const float>(vd), static_cast<float>(scale),
                ptr<float>(out), total.data_ptr<float>());
    CHECK(rel_diff(out, dense.detach()) <= 1e-6);
    // The merged log-sum-exp: the causal one and the diagonal scores'.
    const at::Tensor diag =
        (q.detach().unsqueeze(3) * at::stack(ks, 3).repeat_interleave(G, 1)).sum(-1) * scale;
    CHECK(rel_diff(total, at::logaddexp(lse_c, diag.logsumexp(-1))) <= 1e-6);
    // Backward: dq_causal from the merged log-sum-exp (as the flash kernel's backward does).
    const at::Tensor tot = at::logaddexp(lse_c, diag.logsumexp(-1));
    const at::Tensor P = (sc - tot.unsqueeze(-1)).exp();
    const at::Tensor D = (g * dense.detach()).sum(-1, true);
    const at::Tensor dq_c = at::matmul(P * (at::matmul(g, v0.transpose(-1, -2)) - D), k0) * scale;
    const at::Tensor g32 = g.to(at::kFloat).contiguous();
    const at::Tensor o32 = out.contiguous();
    const at::Tensor dqc32 = dq_c.to(at::kFloat).contiguous();
    const at::Tensor t32 = total.contiguous();
    at::Tensor dq = torch::empty_like(q32), dkd = torch::empty_like(kd),
               dvd = torch::empty_like(vd);
    const size_t shared = static_cast<size_t>(
        dev::kWarpsPerBlock * fsdp::kernels::launch::merge_shared_bytes_per_warp(s.steps, s.d));
    emu::launch(blocks, 32 * dev::kWarpsPerBlock, shared, dev::merge_backward_kernel<float>, sh,
                ptr<const float>(q32), st, ptr<const float>(g32), st, ptr<const float>(o32), st,
                t32.data_ptr<float>(), ptr<const float>(kd), ptr<const float>(vd),
                ptr<const float>(dqc32), st, static_cast<float>(scale), ptr<float>(dq),
                ptr<float>(dkd), ptr<float>(dvd));
    CHECK(rel_diff(dq, ref[0]) <= 1e-6);
    for (int64_t j = 0; j < s.steps; ++j) {
      INFO("step " << j + 1);
      CHECK(rel_diff(dkd.select(3, j), ref[static_cast<size_t>(1 + 2 * j)]) <= 1e-6);
      CHECK(rel_diff(dvd.select(3, j), ref[static_cast<size_t>(2 + 2 * j)]) <= 1e-6);
    }
  }
#endif
}
