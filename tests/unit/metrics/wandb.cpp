// W&B through the official SDK in a side process: an offline run is produced with the logged
// values, and the API key never lands in the run's files. Skipped (with a message) when wandb is
// not installed in the venv.
// GCC 12 reports false -Warray-bounds and -Wstringop-overflow inside std::string concatenation at
// -O2 (GCC bug 105329).
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <dirent.h>

#include <cstdlib>
#include <fstream>

#include "core/error.h"
#include "metrics/sinks.h"
#include "metrics_test_util.h"
#include "support/test_paths.h"

using namespace fsdp::metrics;
using fsdp::metrics::test::read_file;
using fsdp::metrics::test::scratch_dir;

namespace {
// launch/setup.sh installs wandb: a venv without it is a broken setup and fails the test.
bool wandb_installed() {
  std::string probe;
  std::string probe_cmd = FSDP_PYTHON;
  probe_cmd.append(" -c 'import wandb' 2>&1");
  return fsdp::metrics::test::run(probe_cmd, &probe) == 0;
}
}  // namespace

TEST_CASE("an offline W&B run is written through the bridge", "[metrics]") {
  if (!wandb_installed())
    FAIL("wandb is not installed in " << FSDP_PYTHON << " (launch/setup.sh installs it)");
  const std::string dir = scratch_dir("wandb");
  ::setenv("WANDB_MODE", "offline", 1);
  ::setenv("WANDB_SILENT", "true", 1);
  WandbOptions o;
  o.python = FSDP_PYTHON;
  o.project = "fsdp-train-test";
  o.name = "unit";
  o.dir = dir;
  o.config_json = R"({"learning_rate": 0.0001, "seed": 7})";
  o.api_key = "local-0123456789abcdef0123456789abcdef01234567";
  std::string run_dir, run_id;
  {
    WandbSink sink(o);
    run_dir = sink.run_dir();
    run_id = sink.run_id();
    for (int step = 1; step <= 3; ++step) {
      sink.log(step, {{"train/loss", 2.0 / step}, {"train/acc_0", 0.25 * step}});
    }
    // A step logged again (what a resume from a checkpoint older than the last logged step
    // does) is kept: W&B would drop it as a history step that does not increase.
    sink.log(2, {{"train/loss", 0.125}, {"train/acc_0", 0.875}});
    sink.close();
  }
  INFO("run dir " << run_dir);
  REQUIRE(run_dir.find(dir + "/wandb/offline-run-") == 0);
  // Offline runs keep everything in the run's .wandb file (a LevelDB-style record log of the
  // SDK's protobuf Records); read it back with the SDK's own protobuf definitions.
  const std::string script = dir + "/read_wandb.py";
  {
    std::ofstream py(script);
    py << R"PY(import glob, os, struct, sys
from wandb.proto import wandb_internal_pb2
run = os.path.dirname(sys.argv[1].rstrip("/"))
data = open(glob.glob(run + "/*.wandb")[0], "rb").read()
assert data[:4] == b":W&B", data[:4]
BLOCK, pos, payload = 32768, 7, b""
while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:
        pos += BLOCK - pos % BLOCK
        continue
    crc, length, rtype = struct.unpack("<IHB", data[pos:pos + 7])
    if rtype == 0 and length == 0:
        break
    payload += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if rtype in (1, 4):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(payload)
        payload = b""
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {(i.key or "/".join(i.nested_key)): i.value_json for i in rec.history.item}
            print("history", items["trainer/step"], items["train/acc_0"], items["train/loss"])
        elif kind == "run":
            print("project", rec.run.project, "name", rec.run.display_name)
            print("run_id", rec.run.run_id)
            for i in rec.run.config.update:
                print("config", i.key, i.value_json)
)PY";
  }
  std::string out;
  std::string cmd = FSDP_PYTHON;
  cmd.append(" ").append(script).append(" ").append(run_dir).append(" 2>&1");
  REQUIRE(fsdp::metrics::test::run(cmd, &out) == 0);
  INFO(out);
  CHECK(out.find("history 1 0.25 2") != std::string::npos);
  CHECK(out.find("history 2 0.5 1") != std::string::npos);
  CHECK(out.find("history 3 0.75 0.666") != std::string::npos);
  CHECK(out.find("history 2 0.875 0.125") != std::string::npos);
  CHECK(out.find("project fsdp-train-test name unit") != std::string::npos);
  CHECK(out.find("config learning_rate 0.0001") != std::string::npos);
  REQUIRE(!run_id.empty());
  CHECK(out.find("run_id " + run_id) != std::string::npos);

  // A resumed training run continues the same W&B run: the id goes back into wandb.init.
  o.resume_run_id = run_id;
  std::string resumed_dir, resumed_id;
  {
    WandbSink sink(o);
    resumed_dir = sink.run_dir();
    resumed_id = sink.run_id();
    sink.log(4, {{"train/loss", 0.5}, {"train/acc_0", 1.0}});
    sink.close();
  }
  CHECK(resumed_id == run_id);
  CHECK(resumed_dir != run_dir);  // offline: a second record log of that run (wandb sync merges)
  out.clear();
  cmd = FSDP_PYTHON;
  cmd.append(" ").append(script).append(" ").append(resumed_dir).append(" 2>&1");
  REQUIRE(fsdp::metrics::test::run(cmd, &out) == 0);
  INFO(out);
  CHECK(out.find("run_id " + run_id) != std::string::npos);
  CHECK(out.find("history 4 1 0.5") != std::string::npos);
  std::string grep;
  std::string grep_cmd = "grep -rl 0123456789abcdef0123456789abcdef ";
  grep_cmd.append(dir).append(" 2>/dev/null");
  fsdp::metrics::test::run(grep_cmd, &grep);
  CHECK(grep.empty());
}

TEST_CASE("a Python without wandb fails with a clear message", "[metrics]") {
  WandbOptions o;
  o.python = "/nonexistent/python3";
  o.dir = scratch_dir("wandb_missing");
  try {
    WandbSink sink(o);
    FAIL("expected an error");
  } catch (const fsdp::Error& e) {
    CHECK(std::string(e.what()).find("--report-to wandb") != std::string::npos);
  }
}

TEST_CASE("--wandb-offline runs W&B offline without WANDB_MODE", "[metrics]") {
  if (!wandb_installed())
    FAIL("wandb is not installed in " << FSDP_PYTHON << " (launch/setup.sh installs it)");
  const std::string dir = scratch_dir("wandb_offline");
  // A user's online setting is overridden for the side process only.
  ::setenv("WANDB_MODE", "online", 1);
  ::setenv("WANDB_SILENT", "true", 1);
  WandbOptions o;
  o.python = FSDP_PYTHON;
  o.project = "fsdp-train-test";
  o.dir = dir;
  o.offline = true;
  std::string run_dir;
  {
    WandbSink sink(o);
    run_dir = sink.run_dir();
    sink.log(1, {{"train/loss", 1.0}});
    sink.close();
  }
  ::setenv("WANDB_MODE", "offline", 1);
  INFO("run dir " << run_dir);
  CHECK(run_dir.find(dir + "/wandb/offline-run-") == 0);
}
