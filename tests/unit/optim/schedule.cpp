// The learning-rate schedules (docs/reference.md §6: warmup then cosine, linear or constant) at
// closed-form points, and the clip coefficient and sum of squares of the global gradient norm.
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
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    REQUIRE_THROWS_AS(scheduled_lr(d, 1.0, 1, 0, 0), fsdp::UsageError);
    REQUIRE_THROWS_AS(scheduled_lr(d, 1.0, 1, 10, 11), fsdp::UsageError);
    REQUIRE_THROWS_AS(scheduled_lr(d, 1.0, 1, 10, -1), fsdp::UsageError);
  }
  REQUIRE_THROWS_AS(check_schedule(0, 0), fsdp::UsageError);
  REQUIRE_THROWS_AS(check_schedule(5, 6), fsdp::UsageError);
  REQUIRE_NOTHROW(check_schedule(5, 5));
  REQUIRE_THROWS_AS(warmup_steps(1.5, 10), fsdp::UsageError);
  REQUIRE_THROWS_AS(warmup_steps(-0.1, 10), fsdp::UsageError);
  REQUIRE(warmup_steps(0.1, 25) == 2);  // truncated, as the reference does
}

TEST_CASE("every decay shares one warmup", "[optim]") {
  // Steps 1..W rise as base * n / W, whatever follows.
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    for (int64_t n = 1; n <= 4; ++n) {
      REQUIRE(scheduled_lr(d, 2.0, n, 20, 4) == warmup_lr(2.0, n, 4));
    }
    REQUIRE(scheduled_lr(d, 2.0, 3, 20, 4) == 1.5);
    REQUIRE(scheduled_lr(d, 2.0, 4, 20, 4) == 2.0);
  }
  REQUIRE(scheduled_lr(LrDecay::kCosine, 1e-4, 7, 50, 5) == warmup_cosine_lr(1e-4, 7, 50, 5));
}

TEST_CASE("linear decay reaches zero at the last step", "[optim]") {
  // total 10, warmup 2: after the warmup base * (10 - n) / 8.
  REQUIRE(warmup_linear_lr(1.0, 3, 10, 2) == Approx(7.0 / 8.0));
  REQUIRE(warmup_linear_lr(1.0, 6, 10, 2) == Approx(0.5));
  REQUIRE(warmup_linear_lr(1.0, 9, 10, 2) == Approx(1.0 / 8.0));
  REQUIRE(warmup_linear_lr(1.0, 10, 10, 2) == 0.0);
  REQUIRE(warmup_linear_lr(1.0, 15, 10, 2) == 0.0);  // never negative past the end
  // No warmup: the first step already decays.
  REQUIRE(warmup_linear_lr(1.0, 1, 4, 0) == Approx(0.75));
  // Warmup over every step: the rate only rises.
  REQUIRE(warmup_linear_lr(1.0, 4, 4, 4) == Approx(1.0));
  // Non-increasing after the warmup.
  for (int64_t n = 3; n < 10; ++n) {
    REQUIRE(warmup_linear_lr(1.0, n + 1, 10, 2) < warmup_linear_lr(1.0, n, 10, 2));
  }
}

TEST_CASE("constant schedule holds the base rate after warmup", "[optim]") {
  REQUIRE(warmup_constant_lr(3e-4, 1, 10, 3) == Approx(1e-4));
  for (int64_t n = 3; n <= 12; ++n) REQUIRE(warmup_constant_lr(3e-4, n, 10, 3) == 3e-4);
  REQUIRE(warmup_constant_lr(3e-4, 1, 10, 0) == 3e-4);
}

TEST_CASE("cosine ends at zero when the warmup covers the run", "[optim]") {
  REQUIRE(warmup_cosine_lr(1.0, 5, 5, 5) == 1.0);  // the last warmup step is the last step
  REQUIRE(warmup_cosine_lr(1.0, 6, 5, 5) == 1.0);  // clamped to the last step
  // The cosine's last step is one step short of 0 (progress (total - 1 - W) / (total - W)).
  REQUIRE(warmup_cosine_lr(1.0, 10, 10, 0) == Approx(0.5 * (1 + std::cos(M_PI * 0.9))));
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
  REQUIRE(fsdp::optim::global_norm_on_device(pieces, nullptr) ==
          Approx(std::sqrt(ss)).epsilon(1e-12));
  REQUIRE(
      std::isinf(fsdp::optim::global_norm_on_device({torch::tensor({INFINITY, 1.0f})}, nullptr)));
}
