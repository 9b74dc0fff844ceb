// GPU paths of the model against their definitions on the same device: the TTT attention
// (fused flash / memory-efficient SDPA kernels merged through the log-sum-exp) against the dense
// reference, the fused RMSNorm against the composite one. Skip without a usable GPU.
#include <catch2/catch.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "model/draft_model.h"
#include "model/ttt_attention.h"
#include "support/torch_gpu.h"

using namespace fsdp::model;

TEST_CASE("cuda: efficient TTT attention matches dense for bf16 and fp32", "[cuda][model]") {
  TORCH_REQUIRE_GPU();
  torch::manual_seed(7);
  const int64_t B = 2, nh = 8, nkv = 2, S = 300, d = 64, steps = 4;
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    at::Tensor q = torch::randn({B, nh, S, d}, opt).requires_grad_(true);
    std::vector<at::Tensor> keys, values;
    for (int64_t j = 0; j < steps; ++j) {
      keys.push_back(torch::randn({B, nkv, S, d}, opt).requires_grad_(true));
      values.push_back(torch::randn({B, nkv, S, d}, opt).requires_grad_(true));
    }
    at::Tensor mask =
        torch::ones({B, S}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
    mask[1].narrow(0, 200, 100).fill_(0);
    const double scale = 0.125;
    at::Tensor eff = ttt_attention_efficient(q, keys, values, mask, scale);
    at::Tensor den = ttt_attention_dense(q, keys, values, mask, scale);
    const double tol = dt == torch::kFloat ? 1e-4 : 3e-2;
    CHECK((eff.to(torch::kFloat) - den.to(torch::kFloat)).abs().max().item<float>() < tol);
    at::Tensor g = torch::randn_like(den);
    auto ge = torch::autograd::grad({eff}, {q, keys[0], values[2]}, {g});
    auto gd = torch::autograd::grad({den}, {q, keys[0], values[2]}, {g});
    for (size_t k = 0; k < ge.size(); ++k) {
      const float scale_ref = gd[k].to(torch::kFloat).abs().max().item<float>();
      CHECK((ge[k].to(torch::kFloat) - gd[k].to(torch::kFloat)).abs().max().item<float>() <
            tol * std::max(1.0f, scale_ref) * 4);
    }
  }
}

TEST_CASE("cuda: fused RMSNorm matches the composite definition", "[cuda][model]") {
  TORCH_REQUIRE_GPU();
  torch::manual_seed(11);
  const int64_t H = 4096;
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    INFO("dtype " << dt);
    auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    at::Tensor x = (torch::randn({2, 333, H}, opt) * 3).requires_grad_(true);
    at::Tensor w = (1 + 0.1 * torch::randn({H}, opt)).detach().requires_grad_(true);
    at::Tensor yf = rms_norm_fused(x, w, 1e-5);
    at::Tensor yc = rms_norm_composite(x, w, 1e-5);
    REQUIRE(yf.scalar_type() == dt);
    REQUIRE(yf.sizes() == yc.sizes());
    at::Tensor diff = (yf.to(torch::kFloat) - yc.to(torch::kFloat)).abs();
    const float top = yc.to(torch::kFloat).abs().max().item<float>();
    if (dt == torch::kFloat) {
      CHECK(diff.max().item<float>() < 1e-5f * top);
    } else {
      // Same rounding steps; only the fp32 summation order of mean(x^2) differs, which moves an
      // element across a bf16 rounding boundary rarely and by one unit.
      CHECK(diff.gt(0).to(torch::kFloat).mean().item<float>() < 0.01f);
      CHECK(diff.max().item<float>() <= top / 64);
    }
    at::Tensor g = torch::randn_like(yc);
    auto gf = torch::autograd::grad({yf}, {x, w}, {g});
    auto gc = torch::autograd::grad({yc}, {x, w}, {g});
    const float tol = dt == torch::kFloat ? 1e-4f : 2e-2f;
    for (size_t k = 0; k < gf.size(); ++k) {
      INFO("gradient " << k);
      REQUIRE(gf[k].scalar_type() == dt);
      const at::Tensor a = gf[k].to(torch::kFloat), b = gc[k].to(torch::kFloat);
      CHECK((a - b).abs().max().item<float>() < tol * b.abs().max().item<float>());
      CHECK((a - b).norm().item<float>() < tol * b.norm().item<float>());
    }
  }
  // The module picks the fused path on the GPU: same output as rms_norm_fused, bitwise.
  RMSNorm norm(H, 1e-5);
  norm->to(torch::kCUDA, torch::kBFloat16);
  at::Tensor x =
      torch::randn({4, H}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
  CHECK(torch::equal(norm(x), rms_norm_fused(x, norm->weight, 1e-5)));
}
