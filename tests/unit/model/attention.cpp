// TTT attention: the efficient LSE-merged path against the dense explicit-mask reference, in
// double precision, for outputs and all input gradients; plus lower-precision sanity.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "core/error.h"
#include "model/ttt_attention.h"

using namespace fsdp::model;

namespace {

struct Inputs {
  at::Tensor q;
  std::vector<at::Tensor> keys, values;
  at::Tensor mask;
};

Inputs make_inputs(int64_t B, int64_t nh, int64_t nkv, int64_t S, int64_t d, int64_t steps,
                   const std::vector<int64_t>& lengths, at::ScalarType dt) {
  Inputs in;
  auto opt = at::TensorOptions().dtype(dt);
  in.q = torch::randn({B, nh, S, d}, opt).requires_grad_(true);
  for (int64_t j = 0; j < steps; ++j) {
    in.keys.push_back(torch::randn({B, nkv, S, d}, opt).requires_grad_(true));
    in.values.push_back(torch::randn({B, nkv, S, d}, opt).requires_grad_(true));
  }
  in.mask = torch::zeros({B, S}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) in.mask[b].narrow(0, 0, lengths[b]).fill_(1);
  return in;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Output and gradients of both implementations for the same upstream gradient.
void compare(const Inputs& in, double tol) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(in.q.size(-1)));
  at::Tensor eff = ttt_attention_efficient(in.q, in.keys, in.values, in.mask, scale);
  at::Tensor den = ttt_attention_dense(in.q, in.keys, in.values, in.mask, scale);
  CHECK(max_diff(eff, den) < tol);
  at::Tensor g = torch::randn_like(den);
  std::vector<at::Tensor> leaves{in.q};
  for (size_t j = 0; j < in.keys.size(); ++j) {
    leaves.push_back(in.keys[j]);
    leaves.push_back(in.values[j]);
  }
  auto ge = torch::autograd::grad({eff}, leaves, {g});
  auto gd = torch::autograd::grad({den}, leaves, {g});
  for (size_t k = 0; k < leaves.size(); ++k) {
    INFO("gradient of leaf " << k);
    CHECK(max_diff(ge[k], gd[k]) < tol);
  }
}

}  // namespace

TEST_CASE("efficient attention equals the dense reference in double (T=1,2,7, GQA, padding)",
          "[model][attention]") {
  torch::manual_seed(1);
  for (int64_t steps : {1, 2, 7}) {
    for (auto [S, nh, nkv] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 2, 2}, {5, 4, 2}, {17, 4, 1}, {33, 6, 3}}) {
      INFO("steps " << steps << " S " << S << " nh " << nh << " nkv " << nkv);
      std::vector<int64_t> lengths{S, std::max<int64_t>(1, S - 3), std::max<int64_t>(1, S / 2)};
      compare(make_inputs(3, nh, nkv, S, 8, steps, lengths, at::kDouble), 1e-10);
    }
  }
}

TEST_CASE("padded query rows are zero and padded keys are never seen", "[model][attention]") {
  torch::manual_seed(2);
  Inputs in = make_inputs(2, 2, 1, 6, 4, 3, {6, 3}, at::kDouble);
  const double scale = 0.5;
  at::Tensor out = ttt_attention_efficient(in.q, in.keys, in.values, in.mask, scale);
  CHECK(out[1].narrow(1, 3, 3).abs().max().item<double>() == 0.0);
  // Changing padded keys/values (positions >= 3 of sample 1) changes nothing.
  std::vector<at::Tensor> k2, v2;
  for (size_t j = 0; j < in.keys.size(); ++j) {
    at::Tensor k = in.keys[j].detach().clone(), v = in.values[j].detach().clone();
    k[1].narrow(1, 3, 3).fill_(100.0);
    v[1].narrow(1, 3, 3).fill_(-7.0);
    k2.push_back(k);
    v2.push_back(v);
  }
  at::Tensor out2 = ttt_attention_efficient(in.q, k2, v2, in.mask, scale);
  CHECK(max_diff(out, out2) == 0.0);
}

TEST_CASE("efficient attention in fp32 and bf16 stays close to the reference",
          "[model][attention]") {
  torch::manual_seed(3);
  Inputs in = make_inputs(2, 4, 2, 40, 16, 4, {40, 25}, at::kFloat);
  const double scale = 0.25;
  at::Tensor eff = ttt_attention_efficient(in.q, in.keys, in.values, in.mask, scale);
  at::Tensor den = ttt_attention_dense(in.q, in.keys, in.values, in.mask, scale);
  CHECK(max_diff(eff, den) < 1e-5);
  auto to_bf16 = [](const at::Tensor& t) { return t.detach().to(at::kBFloat16); };
  std::vector<at::Tensor> kb, vb;
  for (size_t j = 0; j < in.keys.size(); ++j) {
    kb.push_back(to_bf16(in.keys[j]));
    vb.push_back(to_bf16(in.values[j]));
  }
  at::Tensor effb = ttt_attention_efficient(to_bf16(in.q), kb, vb, in.mask, scale);
  CHECK(effb.scalar_type() == at::kBFloat16);
  CHECK(max_diff(effb, den) < 5e-2);
}

TEST_CASE("check_right_padded rejects holes and left padding", "[model][attention]") {
  check_right_padded(torch::tensor({1, 1, 0, 0}, torch::kLong).view({1, 4}));
  CHECK_THROWS_WITH(check_right_padded(torch::tensor({0, 1, 1, 1}, torch::kLong).view({1, 4})),
                    Catch::Contains("not right-padded"));
  CHECK_THROWS_WITH(check_right_padded(torch::tensor({1, 0, 1, 0}, torch::kLong).view({1, 4})),
                    Catch::Contains("not right-padded"));
  CHECK_THROWS_WITH(check_right_padded(torch::tensor({1, 2}, torch::kLong).view({1, 2})),
                    Catch::Contains("only 0 and 1"));
}

TEST_CASE("bad attention inputs are rejected with a message", "[model][attention]") {
  Inputs in = make_inputs(1, 4, 2, 5, 4, 2, {5}, at::kDouble);
  CHECK_THROWS_AS(ttt_attention_efficient(in.q, in.keys, {in.values[0]}, in.mask, 1.0),
                  fsdp::Error);
  CHECK_THROWS_WITH(ttt_attention_dense(in.q, in.keys, in.values, torch::ones({1, 4}), 1.0),
                    Catch::Contains("attention_mask"));
}
