// GPU path of the TTT attention (fused flash / memory-efficient SDPA kernels merged through the
// log-sum-exp) against the dense reference on the same device. Skips without a usable GPU.
#include <catch2/catch.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "model/ttt_attention.h"

using namespace fsdp::model;

// unit_model links only fsdp_model (no comm), so the GPU probe is LibTorch's own; it reports
// false without a driver, as tests/support/gpu.h does through comm::gpu_count().
#define MODEL_REQUIRE_GPU()                                         \
  do {                                                              \
    if (!torch::cuda::is_available()) {                             \
      WARN("skipped: no GPU visible (needs CUDA driver + device)"); \
      return;                                                       \
    }                                                               \
  } while (0)

TEST_CASE("cuda: efficient TTT attention matches dense for bf16 and fp32", "[cuda][model]") {
  MODEL_REQUIRE_GPU();
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
