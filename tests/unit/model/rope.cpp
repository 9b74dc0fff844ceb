// RoPE: inverse frequencies for default, linear, llama3 and yarn scaling against the formulas
// evaluated independently in double, the relative-position property, and table growth.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cmath>

#include "model/rope.h"

using namespace fsdp::model;

namespace {

DraftConfig rope_config(int64_t d, double theta) {
  DraftConfig c;
  c.hidden_size = d * 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.intermediate_size = 8;
  c.vocab_size = 10;
  c.rope_theta = theta;
  c.max_position_embeddings = 32;
  return c;
}

double base_freq(int64_t k, int64_t d, double theta) {
  return std::pow(theta, -2.0 * k / d);
}

}  // namespace

TEST_CASE("default and linear inverse frequencies", "[model][rope]") {
  DraftConfig c = rope_config(16, 10000.0);
  RopeFrequencies f = rope_frequencies(c);
  REQUIRE(f.inv_freq.numel() == 8);
  for (int64_t k = 0; k < 8; ++k) {
    CHECK(f.inv_freq[k].item<float>() == Approx(base_freq(k, 16, 1e4)).epsilon(1e-6));
  }
  CHECK(f.attention_scaling == 1.0);
  c.rope_scaling.type = RopeType::kLinear;
  c.rope_scaling.factor = 4.0;
  RopeFrequencies lin = rope_frequencies(c);
  for (int64_t k = 0; k < 8; ++k) {
    CHECK(lin.inv_freq[k].item<float>() == Approx(base_freq(k, 16, 1e4) / 4).epsilon(1e-6));
  }
}

TEST_CASE("llama3 scaling keeps high frequencies, divides low ones, smooths between",
          "[model][rope]") {
  DraftConfig c = rope_config(64, 500000.0);
  c.rope_scaling.type = RopeType::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  RopeFrequencies f = rope_frequencies(c);
  const double low_wl = 8192 / 1.0, high_wl = 8192 / 4.0;
  int kept = 0, divided = 0, smoothed = 0;
  for (int64_t k = 0; k < 32; ++k) {
    const double inv = base_freq(k, 64, 5e5), wl = 2 * M_PI / inv;
    double expected;
    if (wl < high_wl) {
      expected = inv;
      ++kept;
    } else if (wl > low_wl) {
      expected = inv / 8;
      ++divided;
    } else {
      const double s = (8192 / wl - 1.0) / (4.0 - 1.0);
      expected = (1 - s) * inv / 8 + s * inv;
      ++smoothed;
    }
    INFO("k " << k);
    CHECK(f.inv_freq[k].item<float>() == Approx(expected).epsilon(1e-5));
  }
  CHECK(kept > 0);
  CHECK(divided > 0);
  CHECK(smoothed > 0);
}

TEST_CASE("yarn scaling: ramp between interpolation and extrapolation, attention factor",
          "[model][rope]") {
  DraftConfig c = rope_config(32, 150000.0);
  c.rope_scaling.type = RopeType::kYarn;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.truncate = false;
  RopeFrequencies f = rope_frequencies(c);
  CHECK(f.attention_scaling == Approx(0.1 * std::log(32.0) + 1.0));
  auto corr = [](double rot) {
    return 32 * std::log(4096 / (rot * 2 * M_PI)) / (2 * std::log(150000.0));
  };
  const double low = std::max(corr(32.0), 0.0), high = std::min(corr(1.0), 31.0);
  for (int64_t k = 0; k < 16; ++k) {
    const double inv = base_freq(k, 32, 1.5e5);
    const double ramp = std::clamp((k - low) / (high - low), 0.0, 1.0);
    const double extrap_weight = 1 - ramp;
    const double expected = inv / 32 * (1 - extrap_weight) + inv * extrap_weight;
    INFO("k " << k);
    CHECK(f.inv_freq[k].item<float>() == Approx(expected).epsilon(1e-5));
  }
  // Explicit attention_factor wins.
  c.rope_scaling.attention_factor = 1.5;
  CHECK(rope_frequencies(c).attention_scaling == 1.5);
}

TEST_CASE("rotary embedding: relative positions and table growth", "[model][rope]") {
  torch::manual_seed(3);
  DraftConfig c = rope_config(8, 10000.0);
  RotaryEmbedding rope(c, 4);
  at::Tensor q = torch::randn({1, 1, 1, 8}, torch::kDouble);
  at::Tensor k = torch::randn({1, 1, 1, 8}, torch::kDouble);
  auto dot_at = [&](int64_t tq, int64_t tk) {
    auto [cq, sq] = rope.slice(tq, 1, torch::kDouble, torch::kCPU);
    at::Tensor rq = apply_rotary(q, cq, sq);
    auto [ck, sk] = rope.slice(tk, 1, torch::kDouble, torch::kCPU);
    at::Tensor rk = apply_rotary(k, ck, sk);
    return (rq * rk).sum().item<double>();
  };
  // Only the distance matters; slices past the initial 4 positions grow the table.
  CHECK(dot_at(3, 1) == Approx(dot_at(10, 8)).margin(1e-12));
  CHECK(dot_at(2, 2) == Approx((q * k).sum().item<double>()).margin(1e-12));
  CHECK(rope.positions() >= 11);
  // Explicit rotate-half formula at position 5.
  auto [c5, s5] = rope.slice(5, 1, torch::kDouble, torch::kCPU);
  at::Tensor rot = apply_rotary(q, c5, s5).view(-1);
  at::Tensor qv = q.view(-1);
  for (int64_t j = 0; j < 4; ++j) {
    const double a = 5 * base_freq(j, 8, 1e4);
    CHECK(rot[j].item<double>() ==
          Approx(qv[j].item<double>() * std::cos(a) - qv[j + 4].item<double>() * std::sin(a))
              .margin(1e-5));
    CHECK(rot[j + 4].item<double>() ==
          Approx(qv[j + 4].item<double>() * std::cos(a) + qv[j].item<double>() * std::sin(a))
              .margin(1e-5));
  }
  auto [cf, sf] = rope.slice(0, 3, torch::kFloat, torch::kCPU);
  CHECK(cf.scalar_type() == torch::kFloat);
  CHECK(cf.sizes() == at::IntArrayRef({3, 8}));
}
