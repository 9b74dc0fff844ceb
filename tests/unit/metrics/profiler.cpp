// The step profiler: records exactly its window of steps, writes a trace that is valid JSON with
// the operators and fsdp:: scopes that ran, and a summary; it never throws into training when it
// cannot write, and a window that never comes writes nothing.
#include <ATen/record_function.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <set>

#include "metrics/profiler.h"
#include "metrics_test_util.h"

using namespace fsdp::metrics;
using fsdp::metrics::test::read_file;
using fsdp::metrics::test::scratch_dir;

namespace {
// One "optimizer step" of work: a matmul forward and backward inside a user scope.
void work(int64_t n) {
  RECORD_USER_SCOPE("fsdp::test_step");
  auto w = torch::randn({n, n}, torch::requires_grad());
  auto y = torch::mm(torch::randn({n, n}), w).sum();
  y.backward();
}

int64_t count_rows(const std::vector<ProfileRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.device == "cpu" && r.name == name) return r.count;
  return 0;
}
}  // namespace

TEST_CASE("the profiler records its window and writes a trace and a summary", "[metrics]") {
  ProfilerOptions o;
  o.start_step = 1;  // steps 2 and 3
  o.num_steps = 2;
  o.dir = scratch_dir("profiler") + "/traces";  // created by the profiler
  o.rank = 3;
  StepProfiler p(o);
  for (int64_t step = 1; step <= 5; ++step) {
    p.before_step(step);
    CHECK(p.active() == (step == 2 || step == 3));
    work(16);
    p.after_step(step);
  }
  p.finish();
  REQUIRE(p.written());
  CHECK(p.trace_path() == o.dir + "/rank3.trace.json");
  const auto trace = nlohmann::json::parse(read_file(p.trace_path()));
  std::multiset<std::string> names;
  for (const auto& e : trace.at("traceEvents"))
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  // Two steps in the window: two user scopes and their matmuls, nothing from steps 1, 4, 5.
  CHECK(names.count("fsdp::test_step") == 2);
  CHECK(names.count("aten::mm") >= 2);
  CHECK(count_rows(p.summary(), "fsdp::test_step") == 2);
  CHECK(count_rows(p.summary(), "aten::mm") == static_cast<int64_t>(names.count("aten::mm")));
  const std::string summary = read_file(p.summary_path());
  CHECK(summary.find("CPU operators and fsdp:: scopes") != std::string::npos);
  CHECK(summary.find("fsdp::test_step") != std::string::npos);
  // Rows are longest first within a device.
  for (size_t i = 1; i < p.summary().size(); ++i) {
    if (p.summary()[i].device == p.summary()[i - 1].device)
      CHECK(p.summary()[i].total_ms <= p.summary()[i - 1].total_ms);
  }
}

TEST_CASE("a run that ends inside the window writes what it recorded", "[metrics]") {
  ProfilerOptions o;
  o.start_step = 0;
  o.num_steps = 10;
  o.dir = scratch_dir("profiler_short");
  StepProfiler p(o);
  p.before_step(1);
  work(8);
  p.after_step(1);
  CHECK(p.active());
  p.finish();
  CHECK(p.written());
  CHECK(count_rows(p.summary(), "fsdp::test_step") == 1);
}

TEST_CASE("a window that never comes or an unwritable directory never stops training",
          "[metrics]") {
  ProfilerOptions late;
  late.start_step = 100;
  late.dir = scratch_dir("profiler_late");
  StepProfiler p(late);
  p.before_step(1);
  CHECK_FALSE(p.active());
  p.finish();
  CHECK_FALSE(p.written());
  CHECK_FALSE(std::ifstream(p.trace_path()).good());

  // The directory cannot be created (a file is in the way): a warning, no exception.
  ProfilerOptions bad;
  bad.start_step = 0;
  bad.num_steps = 1;
  const std::string base = scratch_dir("profiler_bad");
  std::ofstream(base + "/file") << "x";
  bad.dir = base + "/file/traces";
  StepProfiler q(bad);
  CHECK_NOTHROW(q.before_step(1));
  CHECK_FALSE(q.active());
  work(4);
  CHECK_NOTHROW(q.after_step(1));
  CHECK_NOTHROW(q.finish());
  CHECK_FALSE(q.written());
  // The profiler is free for the next user.
  ProfilerOptions again;
  again.start_step = 0;
  again.num_steps = 1;
  again.dir = base + "/ok";
  StepProfiler r(again);
  r.before_step(1);
  work(4);
  r.after_step(1);
  CHECK(r.written());
}
