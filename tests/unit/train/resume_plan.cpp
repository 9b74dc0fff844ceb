// The resume planner on real directories in a temporary folder, with the ranks' agreement
// faked: which checkpoints are tried (newest first), which are passed over, and the refusals.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "train/resume_plan.h"
#include "train/run_state.h"

using namespace fsdp;
using namespace fsdp::train;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("fsdp_resume_plan_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  // fsdp::remove_tree: the torch wheel's std::filesystem::remove_all crashes (architecture.md).
  ~TempDir() { fsdp::remove_tree(path.string()); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

void touch(const fs::path& p) {
  std::ofstream(p) << "x";
}

// A complete checkpoint directory; `readable` gives it a model.safetensors with d2t/t2d.
std::string make_checkpoint(const fs::path& out, int64_t epoch, int64_t step, bool readable,
                            const std::string& launch_id = "") {
  const fs::path dir = out / ("epoch_" + std::to_string(epoch) + "_step_" + std::to_string(step));
  fs::create_directories(dir);
  if (readable) {
    // Weights-only (no draft config): written directly, as write_draft_export would refuse it
    // (its serving check on itself needs a whole draft).
    checkpoint::write_safetensors(
        (dir / "model.safetensors").string(),
        {{"d2t", at::arange(4, at::kLong)}, {"t2d", at::arange(8, at::kLong).to(at::kBool)}});
  }
  RunState st;
  st.step = step;
  st.launch_id = launch_id;
  save_run_state(dir.string(), st);
  touch(dir / checkpoint::kCompleteMarker);
  return dir.string();
}

// One rank: agreement is the rank's own answer; `peer_fails` says another rank answers yes on
// the n-th any_rank call (0-based), -1 for never.
struct FakeRanks {
  int calls = 0, same_checks = 0;
  int peer_fails = -1;
  ResumeAgreement agreement() {
    ResumeAgreement a;
    a.any_rank = [this](bool mine) { return mine || calls++ == peer_fails; };
    a.check_same = [this](const std::vector<checkpoint::CheckpointRef>&) { ++same_checks; };
    return a;
  }
};

ResumeRequest request(config::ResumeMode mode, const fs::path& out) {
  ResumeRequest r;
  r.mode = mode;
  r.output_dir = out.string();
  return r;
}

}  // namespace

TEST_CASE("a fresh start in an empty directory", "[train]") {
  TempDir t;
  FakeRanks ranks;
  const ResumePlan plan =
      plan_resume(request(config::ResumeMode::kNone, t.path), ranks.agreement());
  CHECK(plan.candidates.empty());
  CHECK(!plan.falls_back);
  CHECK(ranks.same_checks == 1);
  const ResumePlan autop =
      plan_resume(request(config::ResumeMode::kAuto, t.path), ranks.agreement());
  CHECK(autop.candidates.empty());
  CHECK(autop.falls_back);
}

TEST_CASE("a fresh start never overwrites a run's checkpoints", "[train]") {
  TempDir t;
  make_checkpoint(t.path, 0, 4, true);
  FakeRanks ranks;
  CHECK_THROWS_AS(plan_resume(request(config::ResumeMode::kNone, t.path), ranks.agreement()),
                  UsageError);
  ResumeRequest eval = request(config::ResumeMode::kNone, t.path);
  eval.eval_only = true;  // evaluation writes no checkpoint
  CHECK(plan_resume(eval, ranks.agreement()).candidates.empty());
}

TEST_CASE("--resume auto: newest first, past damaged checkpoints", "[train]") {
  TempDir t;
  const std::string older = make_checkpoint(t.path, 0, 2, true);
  const std::string newer = make_checkpoint(t.path, 1, 4, true);
  FakeRanks ranks;
  ResumePlan plan = plan_resume(request(config::ResumeMode::kAuto, t.path), ranks.agreement());
  REQUIRE(plan.candidates.size() == 2);
  CHECK(plan.candidates[0].path == newer);
  CHECK(plan.candidates[1].path == older);
  CHECK(plan.falls_back);
  // Another rank cannot read the newest: every rank passes it over.
  FakeRanks peer;
  peer.peer_fails = 0;
  plan = plan_resume(request(config::ResumeMode::kAuto, t.path), peer.agreement());
  REQUIRE(plan.candidates.size() == 1);
  CHECK(plan.candidates[0].path == older);
  // A newest checkpoint without weights is passed over here too.
  make_checkpoint(t.path, 1, 6, false);
  plan = plan_resume(request(config::ResumeMode::kAuto, t.path), ranks.agreement());
  REQUIRE(plan.candidates.size() == 2);
  CHECK(plan.candidates[0].path == newer);
}

TEST_CASE("--resume auto refuses when nothing can be read", "[train]") {
  TempDir t;
  make_checkpoint(t.path, 0, 2, false);
  FakeRanks ranks;
  CHECK_THROWS_AS(plan_resume(request(config::ResumeMode::kAuto, t.path), ranks.agreement()),
                  UsageError);
}

TEST_CASE("--resume auto next to another trainer's exports", "[train]") {
  TempDir t;
  fs::create_directories(t.path / "epoch_0");
  touch(t.path / "epoch_0" / "config.json");
  touch(t.path / "epoch_0" / "model.safetensors");
  FakeRanks ranks;
  CHECK_THROWS_AS(plan_resume(request(config::ResumeMode::kAuto, t.path), ranks.agreement()),
                  UsageError);
  ResumeRequest init = request(config::ResumeMode::kAuto, t.path);
  init.has_init_checkpoint = true;  // --init-checkpoint says where to start
  CHECK(plan_resume(init, ranks.agreement()).candidates.empty());
}

TEST_CASE("--resume PATH", "[train]") {
  TempDir out, other;
  const std::string mine = make_checkpoint(out.path, 0, 2, true);
  FakeRanks ranks;
  ResumeRequest r = request(config::ResumeMode::kPath, out.path);
  r.path = mine;
  ResumePlan plan = plan_resume(r, ranks.agreement());
  REQUIRE(plan.candidates.size() == 1);
  CHECK(plan.candidates[0].path == mine);
  CHECK(!plan.falls_back);
  // Not a complete checkpoint.
  fs::create_directories(other.path / "half");
  r.path = (other.path / "half").string();
  CHECK_THROWS_AS(plan_resume(r, ranks.agreement()), UsageError);
  // Outside --output-dir, which holds another run's checkpoints: the runs would mix.
  r.path = make_checkpoint(other.path, 0, 8, true);
  CHECK_THROWS_AS(plan_resume(r, ranks.agreement()), UsageError);
  // ... but into an empty --output-dir it continues.
  TempDir empty;
  r.output_dir = empty.path.string();
  CHECK(plan_resume(r, ranks.agreement()).candidates.size() == 1);
}

TEST_CASE("a launcher restart takes its own launch's checkpoints first", "[train]") {
  TempDir t;
  const std::string theirs = make_checkpoint(t.path, 0, 6, true, "other-launch");
  const std::string own = make_checkpoint(t.path, 0, 4, true, "L1");
  (void)theirs;
  FakeRanks ranks;
  ResumeRequest r = request(config::ResumeMode::kNone, t.path);
  r.launch.attempt = 1;
  r.launch.launch_id = "L1";
  const ResumePlan plan = plan_resume(r, ranks.agreement());
  REQUIRE(plan.candidates.size() == 1);
  CHECK(plan.candidates[0].path == own);
  CHECK(plan.falls_back);
}

TEST_CASE("inside_output_dir however spelled", "[train]") {
  TempDir t;
  const std::string ckpt = make_checkpoint(t.path, 0, 2, true);
  CHECK(inside_output_dir(ckpt, t.path.string()));
  CHECK(inside_output_dir(ckpt + "/", t.path.string() + "/"));
  CHECK(!inside_output_dir(ckpt, (t.path / "epoch_0_step_2").string()));
  CHECK(!inside_output_dir(ckpt, ""));
}
