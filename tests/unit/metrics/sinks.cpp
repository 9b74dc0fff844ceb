// Console progress line (TTY vs redirected output), metrics.jsonl, the TensorBoard writer read
// back by the venv's tensorboard package, both on a full disk, and the --report-to factory.
#include "metrics/sinks.h"

#include <sys/stat.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include "metrics_test_util.h"
#include "support/file_size_limit.h"
#include "support/test_paths.h"

using namespace fsdp::metrics;
using fsdp::metrics::test::read_file;
using fsdp::metrics::test::scratch_dir;

namespace {

const Scalars kScalars = {{"train/loss", 3.25},        {"train/ploss_0", 1.5},
                          {"train/acc_0", 0.4125},     {"train/lr", 9.87e-5},
                          {"perf/tokens_per_s", 5120}, {"perf/eta_s", 250}};

// The scalar points of the event files in `dir` as the venv's tensorboard package reads them
// (EventAccumulator, including its purge of points a restarted run logged again): (tag, step,
// value) in tag, then step order. *out gets everything the script printed.
std::vector<std::tuple<std::string, int, double>> read_tensorboard(const std::string& dir,
                                                                   std::string* out) {
  const std::string script = dir + "/read.py";
  {
    std::ofstream py(script);
    py << "import sys\n"
          "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
          "ea = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})\n"
          "ea.Reload()\n"
          "for tag in sorted(ea.Tags()['scalars']):\n"
          "    for e in ea.Scalars(tag):\n"
          "        print('scalar', tag, e.step, repr(e.value))\n";
  }
  const int rc =
      fsdp::metrics::test::run(std::string(FSDP_PYTHON) + " " + script + " " + dir + " 2>&1", out);
  INFO(*out);
  REQUIRE(rc == 0);
  std::vector<std::tuple<std::string, int, double>> points;
  std::istringstream in(*out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("scalar ", 0) != 0) continue;
    std::istringstream row(line.substr(7));
    std::string tag;
    int step = 0;
    double value = 0;
    row >> tag >> step >> value;
    points.emplace_back(tag, step, value);
  }
  return points;
}

std::string captured(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[1024];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

}  // namespace

TEST_CASE("the progress line carries step/total, loss, acc_0, lr, tokens/s and ETA", "[metrics]") {
  ConsoleSink c(1000, stdout, 0);
  CHECK(c.format_line(120, kScalars) ==
        "step 120/1000 (12.0%) | loss 3.2500 | acc_0 0.412 | lr 9.87e-05 | 5.1k tok/s | ETA 4m10s");
  const Scalars nan_loss = {{"train/ploss_0", std::nan("")}};
  CHECK(c.format_line(1, nan_loss) == "step 1/1000 (0.1%) | loss nan");
  // An evaluation: every step's accuracy and the simulated acceptance length on one line.
  const Scalars eval = {{"eval/loss", 2.5},
                        {"eval/acc_0", 0.5},
                        {"eval/acc_1", 0.25},
                        {"eval/ploss_0", 1.0},
                        {"eval/accept_len", 1.625}};
  CHECK(c.format_line(40, eval) ==
        "eval at step 40 | loss 2.5000 | acc 0.500 0.250 | accept_len 1.62");
  // The time breakdown closes the line, in a fixed order.
  const Scalars shares = {{"train/loss", 1.0},           {"perf/other_share", 0.02},
                          {"perf/data_share", 0.01},     {"perf/forward_share", 0.41},
                          {"perf/backward_share", 0.47}, {"perf/comm_share", 0.03},
                          {"perf/optimizer_share", 0.06}};
  CHECK(c.format_line(2, shares) ==
        "step 2/1000 (0.2%) | loss 1.0000 | fwd 41% bwd 47% comm 3% opt 6% data 1% other 2%");
}

TEST_CASE("redirected output gets one line per log call and no live updates", "[metrics]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    ConsoleSink c(100, f, 0);
    for (int step = 1; step <= 20; ++step) {
      c.heartbeat(step);
      if (step % 10 == 0) c.log(step, kScalars);
    }
    c.flush();
  }
  const std::string out = captured(f);
  std::fclose(f);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(std::count(out.begin(), out.end(), '\n') == 2);
  CHECK(out.rfind("step 10/100", 0) == 0);
}

TEST_CASE("a terminal gets in-place updates", "[metrics]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    ConsoleSink c(100, f, 1);
    c.heartbeat(1);
    c.heartbeat(2);
    c.log(2, kScalars);
    c.heartbeat(3);
    c.flush();
  }
  const std::string out = captured(f);
  std::fclose(f);
  CHECK(std::count(out.begin(), out.end(), '\r') == 4);
  CHECK(std::count(out.begin(), out.end(), '\n') == 2);  // the log line and the final flush
}

TEST_CASE("metrics.jsonl: one object per step, non-finite as null, appended on resume",
          "[metrics]") {
  const std::string dir = scratch_dir("jsonl");
  const std::string path = dir + "/sub/metrics.jsonl";
  {
    JsonlSink s(path);
    s.log(1, {{"train/loss", 2.5}, {"train/acc_0", 0.25}});
    s.log(2, {{"train/loss", std::numeric_limits<double>::infinity()}});
  }
  {
    JsonlSink s(path);  // a resumed run continues the file
    s.log(3, {{"train/loss", 1.0}});
  }
  std::istringstream in(read_file(path));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["step"] == 1);
  CHECK(rows[0]["train/loss"] == 2.5);
  CHECK(rows[0]["train/acc_0"] == 0.25);
  CHECK(rows[0]["time"].get<double>() > 1.6e9);
  CHECK(rows[1]["train/loss"].is_null());
  CHECK(rows[2]["step"] == 3);
}

TEST_CASE("metrics.jsonl of a resumed run: records after the checkpoint move aside", "[metrics]") {
  const std::string dir = scratch_dir("jsonl_resume");
  const std::string path = dir + "/metrics.jsonl";
  {
    JsonlSink s(path);
    for (int step = 1; step <= 5; ++step) s.log(step, {{"train/loss", 1.0 * step}});
  }
  {
    std::ofstream torn(path, std::ios::app);  // a process killed in the middle of a line
    torn << "{\"step\": 6, \"train/lo";
  }
  {
    JsonlSink s(path, /*resumed_step=*/3);  // resumed from the step-3 checkpoint
    for (int step = 4; step <= 5; ++step) s.log(step, {{"train/loss", 10.0 * step}});
  }
  const auto steps_and_losses = [](const std::string& text) {
    std::string out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      out += j.is_discarded() ? std::string("torn ")
                              : std::to_string(j["step"].get<int>()) + ":" +
                                    std::to_string(j["train/loss"].get<int>()) + " ";
    }
    return out;
  };
  CHECK(steps_and_losses(read_file(path)) == "1:1 2:2 3:3 4:40 5:50 ");
  CHECK(steps_and_losses(read_file(dir + "/metrics.superseded.jsonl")) == "4:4 5:5 torn ");
  // A resume with nothing to move leaves both files alone.
  { JsonlSink s(path, /*resumed_step=*/5); }
  CHECK(steps_and_losses(read_file(path)) == "1:1 2:2 3:3 4:40 5:50 ");
  CHECK(steps_and_losses(read_file(dir + "/metrics.superseded.jsonl")) == "4:4 5:5 torn ");
}

TEST_CASE("TensorBoard event files read back with the tensorboard package", "[metrics]") {
  const std::string dir = scratch_dir("tensorboard");
  std::string path;
  {
    TensorBoardSink tb(dir);
    path = tb.path();
    for (int step = 1; step <= 5; ++step) {
      tb.log(step * 10,
             {{"train/loss", 4.0 / step}, {"train/acc_0", 0.1 * step}, {"train/lr", 1e-4 * step}});
    }
  }
  CHECK(path.find(dir + "/events.out.tfevents.") == 0);
  std::string out;
  const auto points = read_tensorboard(dir, &out);
  INFO(out);
  int rows = 0;
  for (const auto& [tag, step, value] : points) {
    const int k = step / 10;
    if (tag == "train/loss")
      CHECK(value == Approx(4.0 / k).epsilon(1e-6));
    else if (tag == "train/acc_0")
      CHECK(value == Approx(0.1 * k).epsilon(1e-6));
    else if (tag == "train/lr")
      CHECK(value == Approx(1e-4 * k).epsilon(1e-6));
    else
      FAIL("unexpected tag " << tag);
    ++rows;
  }
  CHECK(rows == 15);
}

TEST_CASE("a resumed run's TensorBoard file replaces the steps logged after its checkpoint",
          "[metrics]") {
  // Steps 1-5 logged, checkpoint at step 3, resumed: steps 4-5 logged again with other values.
  const std::string dir = scratch_dir("tensorboard_resume");
  {
    TensorBoardSink first(dir);
    for (int step = 1; step <= 5; ++step) first.log(step, {{"train/loss", 1.0 * step}});
  }
  {
    TensorBoardSink resumed(dir, /*resumed_step=*/3);
    for (int step = 4; step <= 5; ++step) resumed.log(step, {{"train/loss", 10.0 * step}});
  }
  std::string out;
  std::string loss;
  for (const auto& [tag, step, value] : read_tensorboard(dir, &out)) {
    if (tag == "train/loss")
      loss += std::to_string(step) + ":" + std::to_string(static_cast<int>(value)) + " ";
  }
  INFO(out);  // (TensorBoard reports the records it removed: the purge.)
  CHECK(loss == "1:1 2:2 3:3 4:40 5:50 ");
}

namespace {
int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace

TEST_CASE("a full disk loses metrics records, never the run or the files' format", "[metrics]") {
  const std::string dir = scratch_dir("full_disk");
  const std::string jsonl = dir + "/metrics.jsonl";
  std::string tb_path;
  {
    JsonlSink js(jsonl);
    TensorBoardSink tb(dir + "/tb");
    tb_path = tb.path();
    for (int step = 1; step <= 3; ++step) {
      js.log(step, kScalars);
      tb.log(step, kScalars);
    }
    const int64_t js_size = file_size(jsonl), tb_size = file_size(tb_path);
    // Room for part of the next record only: it is cut back off, nothing is thrown.
    fsdp::testing::with_file_size_limit(std::max(js_size, tb_size) + 40, [&] {
      CHECK_NOTHROW(js.log(4, kScalars));
      CHECK_NOTHROW(tb.log(4, kScalars));
    });
    CHECK(file_size(jsonl) == js_size);
    CHECK(file_size(tb_path) == tb_size);
    js.log(5, kScalars);  // room again
    tb.log(5, kScalars);
  }
  std::istringstream lines(read_file(jsonl));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(lines, line);) {
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  }
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 5});
  std::string out;
  const int rc = fsdp::metrics::test::run(
      std::string(FSDP_PYTHON) +
          " -c \"import sys; from tensorboard.backend.event_processing.event_accumulator import "
          "EventAccumulator as E; e = E(sys.argv[1]); e.Reload(); "
          "print([s.step for s in e.Scalars('train/loss')])\" " +
          dir + "/tb 2>&1",
      &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("[1, 2, 3, 5]") != std::string::npos);
}

TEST_CASE("--report-to picks the sinks; other ranks get none", "[metrics]") {
  const std::string dir = scratch_dir("factory");
  fsdp::config::MetricsConfig cfg;
  cfg.report_to = {fsdp::config::MetricSink::kTensorBoard};
  SinkContext ctx;
  ctx.output_dir = dir;
  ctx.total_steps = 10;
  auto logger = make_logger(cfg, ctx);
  CHECK(logger->size() == 3);  // console, jsonl, tensorboard
  logger->log(1, {{"train/loss", 1.0}});
  logger->close();
  CHECK(read_file(dir + "/metrics.jsonl").find("\"train/loss\":1.0") != std::string::npos);
  CHECK(std::system(("ls " + dir + "/tensorboard/events.out.tfevents.* >/dev/null").c_str()) == 0);
  ctx.rank = 1;
  CHECK(make_logger(cfg, ctx)->size() == 0);
}
