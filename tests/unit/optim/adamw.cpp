// AdamW kernel against LibTorch's own torch::optim::AdamW: same values after several steps, with
// and without weight decay, gradient scaling equal to pre-multiplied gradients, option checks.
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "optim/adamw.h"

using fsdp::optim::AdamWOptions;
using fsdp::optim::AdamWStep;

namespace {

// Largest difference relative to the tensor's largest value (elementwise ratios are
// meaningless for weights that pass near zero).
double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST_CASE("adamw matches torch::optim::AdamW over several steps", "[optim]") {
  for (double wd : {0.0, 0.1}) {
    torch::manual_seed(1);
    torch::Tensor ref = torch::randn({4099}).requires_grad_(true);
    torch::Tensor p = ref.detach().clone();
    torch::Tensor m = torch::zeros_like(p), v = torch::zeros_like(p);
    torch::optim::AdamW opt(
        {ref}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
    AdamWOptions o;
    o.beta2 = 0.95;
    for (int step = 1; step <= 6; ++step) {
      torch::Tensor g = torch::randn({4099}) * (step % 2 ? 1.0 : 1e-3);
      ref.mutable_grad() = g.clone();
      opt.step();
      fsdp::optim::adamw_update(p, g, m, v, o, wd, AdamWStep{1e-2, step, 1.0});
      REQUIRE(max_rel_diff(p, ref.detach()) < 1e-6);
    }
  }
}

TEST_CASE("adamw grad_scale equals scaling the gradient first", "[optim]") {
  torch::manual_seed(2);
  torch::Tensor g = torch::randn({1000});
  torch::Tensor p1 = torch::randn({1000}), p2 = p1.clone();
  torch::Tensor m1 = torch::zeros_like(p1), v1 = torch::zeros_like(p1);
  torch::Tensor m2 = torch::zeros_like(p1), v2 = torch::zeros_like(p1);
  AdamWOptions o;
  fsdp::optim::adamw_update(p1, g, m1, v1, o, 0.0, AdamWStep{1e-3, 1, 0.25});
  fsdp::optim::adamw_update(p2, g * 0.25f, m2, v2, o, 0.0, AdamWStep{1e-3, 1, 1.0});
  REQUIRE(torch::equal(m1, m2));
  REQUIRE(torch::allclose(p1, p2, 0, 1e-7));
}

TEST_CASE("adamw first step moves each weight by about lr", "[optim]") {
  // With bias correction the first update is lr * g / (|g| + eps'): sign(g) * lr.
  torch::Tensor p = torch::zeros({8});
  torch::Tensor g = torch::tensor({1.f, -2.f, 3.f, -4.f, 0.5f, -0.5f, 10.f, -10.f});
  torch::Tensor m = torch::zeros_like(p), v = torch::zeros_like(p);
  fsdp::optim::adamw_update(p, g, m, v, AdamWOptions{}, 0.0, AdamWStep{1e-3, 1, 1.0});
  REQUIRE(torch::allclose(p, -1e-3 * torch::sign(g), 1e-4, 0));
}

TEST_CASE("adamw options are validated with the flag name", "[optim]") {
  AdamWOptions o;
  o.beta1 = 1.0;
  REQUIRE_THROWS_AS(o.validate(), fsdp::UsageError);
  o = AdamWOptions{};
  o.eps = 0;
  REQUIRE_THROWS_WITH(o.validate(), Catch::Contains("adam eps"));
  o = AdamWOptions{};
  REQUIRE(fsdp::optim::decays(o, 2));
  REQUIRE_FALSE(fsdp::optim::decays(o, 1));
}

TEST_CASE("fused multi-tensor AdamW (the GPU path) equals the per-piece loop", "[optim]") {
  // The engine's GPU path calls torch's fused kernel for all pieces at once; here its CPU
  // implementation is checked against the loop: pieces with and without decay, clipping.
  using fsdp::optim::AdamWImpl;
  using fsdp::optim::AdamWPiece;
  torch::manual_seed(3);
  const std::vector<int64_t> sizes{1000, 17, 4099, 0};
  std::vector<AdamWPiece> loop, fused;
  std::vector<torch::Tensor> initial;
  for (size_t k = 0; k < sizes.size(); ++k) {
    torch::Tensor p = torch::randn({sizes[k]});
    initial.push_back(p.clone());
    const double wd = k % 2 ? 0.0 : 0.1;
    loop.push_back({p.clone(), torch::zeros({sizes[k]}), torch::zeros({sizes[k]}),
                    torch::zeros({sizes[k]}), wd});
    fused.push_back({p.clone(), torch::zeros({sizes[k]}), torch::zeros({sizes[k]}),
                     torch::zeros({sizes[k]}), wd});
  }
  AdamWOptions o;
  o.beta2 = 0.95;
  for (int step = 1; step <= 5; ++step) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      torch::Tensor g = torch::randn({sizes[k]});
      loop[k].grad.copy_(g);
      fused[k].grad.copy_(g);  // the fused kernel overwrites it with the scaled gradient
    }
    const AdamWStep s{3e-3, step, step % 2 ? 0.5 : 1.0};
    fsdp::optim::adamw_update_all(loop, o, s, AdamWImpl::kLoop);
    fsdp::optim::adamw_update_all(fused, o, s, AdamWImpl::kFused);
    for (size_t k = 0; k + 1 < sizes.size(); ++k) {
      INFO("step " << step << " piece " << k);
      CHECK(max_rel_diff(fused[k].param, loop[k].param) < 1e-6);
      CHECK(max_rel_diff(fused[k].exp_avg, loop[k].exp_avg) < 1e-6);
      CHECK(max_rel_diff(fused[k].exp_avg_sq, loop[k].exp_avg_sq) < 1e-6);
    }
  }
  // Both really updated (5 steps of lr 3e-3 with random gradients: mean movement ~5e-3).
  CHECK((fused[0].param - initial[0]).abs().mean().item<double>() > 1e-3);
  CHECK((loop[2].param - initial[2]).abs().mean().item<double>() > 1e-3);
}

TEST_CASE("the host AdamW loop runs on every thread it is given", "[optim]") {
  // LibTorch's at::parallel_for is an inline OpenMP template: compiled without -fopenmp it runs
  // on one thread whatever --threads says (the --cpu-offload step on the 16-core H200 host took
  // 2.0 s that way).
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  CHECK(fsdp::optim::host_loop_threads() == 2);
  at::set_num_threads(1);
  CHECK(fsdp::optim::host_loop_threads() == 1);
  at::set_num_threads(before);
}
