// StepHealth: skipped-step accounting from host-resolved and device-resident step results.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "core/error.h"
#include "train/step_health.h"

using fsdp::shard::StepResult;
using fsdp::train::StepHealth;

namespace {

StepResult host(double norm) {
  StepResult r;
  r.grad_norm = norm;
  r.skipped = !std::isfinite(norm);
  return r;
}

// What the engine returns with device step scalars (CPU tensors stand in for the device).
StepResult device(double norm) {
  StepResult r;
  r.resolved = false;
  r.grad_norm_t = at::scalar_tensor(norm, at::kDouble);
  r.skipped_t = at::scalar_tensor(std::isfinite(norm) ? 0.0 : 1.0, at::kFloat);
  r.clip_coef_t = at::scalar_tensor(1.0, at::kDouble);
  r.step_t = at::scalar_tensor(0.0, at::kFloat);
  return r;
}

}  // namespace

TEST_CASE("host results are accounted at once", "[train]") {
  int64_t skipped = 0;
  StepHealth h(3, &skipped);
  h.add(host(1.5), 1);
  CHECK(h.last_grad_norm() == 1.5);
  h.add(host(NAN), 2);
  h.add(host(INFINITY), 3);
  CHECK(skipped == 2);
  CHECK(h.consecutive() == 2);
  h.add(host(0.5), 4);
  CHECK(h.consecutive() == 0);
  h.add(host(NAN), 5);
  h.add(host(NAN), 6);
  CHECK_THROWS_WITH(h.add(host(NAN), 7), Catch::Contains("3 consecutive optimizer steps"));
  CHECK(skipped == 5);
}

TEST_CASE("device results are summed on the device and read at flush", "[train]") {
  int64_t skipped = 0;
  StepHealth h(3, &skipped);
  h.add(device(2.0), 1);
  h.add(device(NAN), 2);
  h.add(device(3.0), 3);
  CHECK(skipped == 0);  // nothing read yet
  h.flush();
  CHECK(skipped == 1);
  CHECK(h.last_grad_norm() == 3.0);
  CHECK(h.consecutive() == 0);
  h.flush();  // nothing pending: no change
  CHECK(skipped == 1);
  // A run of 3 skipped steps inside one window ends the run at the flush, even though the
  // window's last step was applied again.
  h.add(device(NAN), 4);
  h.add(device(NAN), 5);
  h.add(device(NAN), 6);
  h.add(device(1.0), 7);
  CHECK_THROWS_WITH(h.flush(), Catch::Contains("3 consecutive optimizer steps"));
  CHECK(skipped == 4);
}

TEST_CASE("a run of skipped steps continues across flushes and result kinds", "[train]") {
  int64_t skipped = 0;
  StepHealth h(3, &skipped);
  h.add(device(NAN), 1);
  h.add(device(NAN), 2);
  h.flush();
  CHECK(h.consecutive() == 2);
  CHECK_THROWS_WITH(h.add(host(NAN), 3), Catch::Contains("3 consecutive"));
  StepHealth g(3, &skipped);
  g.add(host(NAN), 1);
  g.add(device(NAN), 2);
  g.add(device(NAN), 3);
  CHECK_THROWS(g.flush());
}
