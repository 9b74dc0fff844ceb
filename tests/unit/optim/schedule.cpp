// Warmup-cosine schedule (spec section 6) at closed-form points, and the clip coefficient and
// sum of squares used for the global gradient norm.
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include <cmath>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "optim/lr_schedule.h"

using namespace fsdp::optim;

TEST_CASE("warmup then cosine to zero", "[optim]") {
  const double base = 1e-4;
  const int64_t total = 100, w = warmup_steps(0.015, total);
  REQUIRE(w == 1);
  REQUIRE(warmup_cosine_lr(base, 1, total, w) == Approx(base));
  // First cosine step n = W + 1 has progress 0: the full base rate.
  REQUIRE(warmup_cosine_lr(base, 2, total, w) == Approx(base));
  REQUIRE(warmup_cosine_lr(base, 51, total, w) ==
          Approx(base * 0.5 * (1 + std::cos(M_PI * 49.0 / 99.0))));
  REQUIRE(warmup_cosine_lr(base, 100, total, w) ==
          Approx(base * 0.5 * (1 + std::cos(M_PI * 98.0 / 99.0))));
  // Clamped at total: never rises again.
  REQUIRE(warmup_cosine_lr(base, 150, total, w) == warmup_cosine_lr(base, 100, total, w));
  // Linear warmup.
  REQUIRE(warmup_cosine_lr(1.0, 5, 100, 10) == Approx(0.5));
  REQUIRE(warmup_cosine_lr(1.0, 10, 100, 10) == Approx(1.0));
  REQUIRE(warmup_cosine_lr(1.0, 1, 100, 0) == Approx(1.0));
}

TEST_CASE("schedule rejects bad arguments", "[optim]") {
  REQUIRE_THROWS_AS(warmup_cosine_lr(1.0, 1, 0, 0), fsdp::UsageError);
  REQUIRE_THROWS_AS(warmup_cosine_lr(1.0, 1, 10, 11), fsdp::UsageError);
  REQUIRE_THROWS_AS(warmup_steps(1.5, 10), fsdp::UsageError);
}

TEST_CASE("clip coefficient and sum of squares", "[optim]") {
  REQUIRE(clip_coefficient(2.0, 0.5) == Approx(0.5 / (2.0 + 1e-6)));
  REQUIRE(clip_coefficient(0.1, 0.5) == 1.0);
  REQUIRE(clip_coefficient(100.0, 0.0) == 1.0);
  torch::Tensor t = torch::arange(1, 5, torch::kFloat);
  REQUIRE(sum_of_squares(t) == Approx(30.0));
  REQUIRE(global_norm(sum_of_squares(t), nullptr) == Approx(std::sqrt(30.0)));
  REQUIRE(std::isnan(global_norm(sum_of_squares(torch::tensor({NAN})), nullptr)));
  // The device variant (one host read per step) agrees on the CPU too, empty pieces included.
  torch::manual_seed(5);
  std::vector<torch::Tensor> pieces{torch::randn({1000}), torch::zeros({0}), torch::randn({7})};
  double ss = 0;
  for (const auto& p : pieces) ss += sum_of_squares(p);
  REQUIRE(fsdp::optim::global_norm_on_device(pieces, nullptr) == Approx(std::sqrt(ss)).epsilon(1e-12));
  REQUIRE(std::isinf(fsdp::optim::global_norm_on_device({torch::tensor({INFINITY, 1.0f})}, nullptr)));
}
