// MLflow through the official package in a side process: a run in a local file store holds the
// logged steps, the configuration as params (long values cut to MLflow's limit) and the tags,
// read back with MLflow's own client; a resumed training run continues the same run. Skipped
// (with a message) when mlflow is not installed in the venv.
// GCC 12 reports false -Warray-bounds and -Wstringop-overflow inside std::string concatenation at
// -O2 (GCC bug 105329).
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <cstdlib>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "metrics/sinks.h"
#include "metrics_test_util.h"
#include "support/test_paths.h"

using namespace fsdp::metrics;
using fsdp::metrics::test::scratch_dir;

namespace {

bool have_mlflow() {
  std::string probe;
  std::string probe_cmd = FSDP_PYTHON;
  probe_cmd.append(" -c 'import mlflow' 2>&1");
  return fsdp::metrics::test::run(probe_cmd, &probe) == 0;
}

// Prints the run as lines: "run <id> <name> <status>", "metric <key> <step> <value>" (history
// order), "param <key> <length> <value's first 40 chars>", "tag <key> <value>".
std::string read_run(const std::string& dir, const std::string& uri, const std::string& run_id) {
  const std::string script = dir + "/read_mlflow.py";
  {
    std::ofstream py(script);
    py << R"PY(import os, sys
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from mlflow.tracking import MlflowClient
c = MlflowClient(sys.argv[1])
r = c.get_run(sys.argv[2])
print("run", r.info.run_id, r.info.run_name, r.info.status)
for key in sorted(r.data.metrics):
    for m in c.get_metric_history(r.info.run_id, key):
        print("metric", key, m.step, m.value)
for k, v in sorted(r.data.params.items()):
    print("param", k, len(v), v[:40])
for k, v in sorted(r.data.tags.items()):
    print("tag", k, v)
print("runs", len(c.search_runs([r.info.experiment_id])))
)PY";
  }
  std::string out;
  std::string cmd = FSDP_PYTHON;
  cmd.append(" ").append(script).append(" ").append(uri).append(" ").append(run_id);
  cmd.append(" 2>&1");
  REQUIRE(fsdp::metrics::test::run(cmd, &out) == 0);
  return out;
}

bool has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

}  // namespace

TEST_CASE("an MLflow run in a file store is written through the bridge and resumed", "[metrics]") {
  // launch/setup.sh installs it: a missing package is a broken setup, not a reason to skip.
  if (!have_mlflow())
    FAIL("mlflow is not installed in " << FSDP_PYTHON << " (launch/setup.sh installs it)");
  const std::string dir = scratch_dir("mlflow");
  const std::string uri = "file://" + dir + "/mlruns";
  MlflowOptions o;
  o.python = FSDP_PYTHON;
  o.tracking_uri = uri;
  o.experiment_name = "unit";
  o.run_name = "first";
  // Nested sections flatten to dotted keys; a value over MLflow's limit is cut, not refused.
  o.config_json = R"({"learning_rate": 0.0001, "loop": {"seed": 7}, "long": ")" +
                  std::string(7000, 'x') + R"(", "odd key!": [1, 2]})";
  o.tags = {{"fsdp-train.output_dir", dir}};
  std::string run_id;
  {
    MlflowSink sink(o);
    run_id = sink.run_id();
    REQUIRE(!run_id.empty());
    CHECK(sink.tracking_uri() == uri);
    for (int step = 1; step <= 3; ++step) {
      sink.log(step, {{"train/loss", 2.0 / step},
                      {"train/acc_0", 0.25 * step},
                      {"train/grad_norm", std::numeric_limits<double>::quiet_NaN()}});
    }
    sink.close();
  }
  std::string out = read_run(dir, uri, run_id);
  INFO(out);
  CHECK(has(out, "run " + run_id + " first FINISHED"));
  CHECK(has(out, "metric train/loss 1 2.0"));
  CHECK(has(out, "metric train/loss 2 1.0"));
  CHECK(has(out, "metric train/acc_0 3 0.75"));
  CHECK(out.find("train/grad_norm") == std::string::npos);  // NaN is not logged
  CHECK(has(out, "param learning_rate 6 0.0001"));
  CHECK(has(out, "param loop.seed 1 7"));
  CHECK(has(out, "param odd key_ 6 [1, 2]"));
  CHECK(out.find("param long 6000 xxxx") != std::string::npos);
  CHECK(has(out, "tag fsdp-train.output_dir " + dir));

  // The resumed training run: the same run gets the later steps; a param whose value changed
  // keeps its logged value (MLflow refuses changes), a new one is added.
  o.resume_run_id = run_id;
  o.run_name = "ignored on resume";
  o.config_json = R"({"learning_rate": 0.5, "max_steps": 6})";
  o.tags = {{"fsdp-train.resumed_from_step", "3"}};
  {
    MlflowSink sink(o);
    CHECK(sink.run_id() == run_id);
    for (int step = 4; step <= 6; ++step) sink.log(step, {{"train/loss", 1.0 / step}});
    sink.close();
  }
  out = read_run(dir, uri, run_id);
  INFO(out);
  CHECK(has(out, "run " + run_id + " first FINISHED"));
  int history = 0;
  for (size_t at = out.find("metric train/loss "); at != std::string::npos;
       at = out.find("metric train/loss ", at + 1)) {
    ++history;
  }
  CHECK(history == 6);  // one entry per logged step, all in the one run
  CHECK(has(out, "metric train/loss 6 0.16666666666666666"));
  CHECK(has(out, "param learning_rate 6 0.0001"));
  CHECK(has(out, "param max_steps 1 6"));
  CHECK(has(out, "tag fsdp-train.resumed_from_step 3"));
  CHECK(has(out, "runs 1"));

  // A run id the store does not have (another tracking URI): a new run, with a warning.
  o.resume_run_id = "0123456789abcdef0123456789abcdef";
  {
    MlflowSink sink(o);
    CHECK(!sink.run_id().empty());
    CHECK(sink.run_id() != o.resume_run_id);
    sink.close();
  }
}

TEST_CASE("a Python without mlflow fails with a clear message", "[metrics]") {
  const std::string dir = scratch_dir("mlflow_missing");
  // A module named mlflow that cannot be imported stands for a venv without the package.
  REQUIRE(std::system(("mkdir -p '" + dir + "/mlflow' && echo 'raise ImportError(\"no\")' > '" +
                       dir + "/mlflow/__init__.py'")
                          .c_str()) == 0);
  ::setenv("PYTHONPATH", dir.c_str(), 1);
  MlflowOptions o;
  o.python = FSDP_PYTHON;
  o.tracking_uri = "file://" + dir + "/mlruns";
  try {
    MlflowSink sink(o);
    FAIL("expected an error");
  } catch (const fsdp::Error& e) {
    CHECK(std::string(e.what()).find("--report-to mlflow") != std::string::npos);
    CHECK(e.hint().find("pip install mlflow-skinny") != std::string::npos);
  }
  ::unsetenv("PYTHONPATH");
  o.python = "/nonexistent/python3";
  CHECK_THROWS_AS(MlflowSink(o), fsdp::Error);
}
