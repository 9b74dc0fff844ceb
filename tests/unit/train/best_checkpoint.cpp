// The best checkpoint (--save-best-by) on real directories: the metric's name and direction,
// strict improvement (ties keep the earlier best, NaN never wins), best.json and the best link,
// a resumed run reading its best back, and the stuck-at-zero metric guard.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "support/test_paths.h"
#include "train/best_checkpoint.h"
#include "train/stuck_metrics.h"

using namespace fsdp;
using namespace fsdp::train;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test-scratch/best_checkpoint/" + name;
  fsdp::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

// A complete checkpoint directory whose only file says which step it is.
std::string make_checkpoint(const std::string& out, int64_t epoch, int64_t step) {
  const std::string dir = out + "/" + checkpoint::checkpoint_name(epoch, step);
  fs::create_directories(dir);
  std::ofstream(dir + "/payload") << step;
  std::ofstream(dir + "/" + checkpoint::kCompleteMarker) << "complete\n";
  return dir;
}

MetricScalars eval_of(const std::string& name, double v) {
  return {{"eval/ploss_0", 1.5}, {name, v}, {"eval/zero_loss_samples", 0}};
}

}  // namespace

TEST_CASE("--save-best-by: names, prefixes and directions", "[train]") {
  CHECK_FALSE(parse_best_metric("none", 3));
  const auto accept = parse_best_metric("eval/accept_len", 3);
  REQUIRE(accept);
  CHECK(accept->name == "eval/accept_len");
  CHECK_FALSE(accept->minimise);
  CHECK(std::string(accept->direction()) == "max");
  // Without a prefix: an evaluation metric.
  CHECK(parse_best_metric("acc_2", 3)->name == "eval/acc_2");
  CHECK(parse_best_metric("simulated_acc_len", 3)->name == "eval/simulated_acc_len");
  // Names with "loss" are minimised.
  CHECK(parse_best_metric("eval/loss", 3)->minimise);
  CHECK(parse_best_metric("eval/ploss_0", 3)->minimise);
  CHECK(std::string(parse_best_metric("eval/ploss_0", 3)->direction()) == "min");
  CHECK_FALSE(parse_best_metric("eval/acc_0", 3)->minimise);
  // What no evaluation logs is refused at start-up, naming the flag.
  for (const char* bad : {"", "train/loss", "perf/mfu", "eval/", "eval/acc_3", "eval/ploss_12",
                          "zero_loss_samples"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_best_metric(bad, 3), UsageError);
  }
  try {
    parse_best_metric("eval/acc_3", 3);
  } catch (const UsageError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("--save-best-by") &&
                                          Catch::Contains("0..2") && Catch::Contains("acc_0"));
  }
}

TEST_CASE("the best improves strictly in its direction; ties and NaN keep the earlier", "[train]") {
  const std::string out = fresh_dir("direction");
  BestTracker up(out, *parse_best_metric("eval/accept_len", 3));
  CHECK(up.improvement(eval_of("eval/accept_len", 1.2)) == 1.2);  // the first one always wins
  up.record(1.2, 4, 0, make_checkpoint(out, 0, 4));
  CHECK_FALSE(up.improvement(eval_of("eval/accept_len", 1.2)));  // a tie keeps step 4
  CHECK_FALSE(up.improvement(eval_of("eval/accept_len", 1.1)));
  CHECK_FALSE(up.improvement(eval_of("eval/accept_len", std::nan(""))));
  CHECK(up.improvement(eval_of("eval/accept_len", 1.3)) == 1.3);
  // A metric the evaluation does not log never wins (and warns once).
  CHECK_FALSE(up.improvement(eval_of("eval/other", 9.0)));
  CHECK_FALSE(up.improvement(eval_of("eval/other", 9.0)));

  const std::string out2 = fresh_dir("direction_min");
  BestTracker down(out2, *parse_best_metric("eval/loss", 3));
  down.record(2.0, 4, 0, make_checkpoint(out2, 0, 4));
  CHECK_FALSE(down.improvement(eval_of("eval/loss", 2.5)));
  CHECK_FALSE(down.improvement(eval_of("eval/loss", 2.0)));
  CHECK(down.improvement(eval_of("eval/loss", 1.5)) == 1.5);
}

TEST_CASE("a new best writes best.json and replaces the best link", "[train]") {
  const std::string out = fresh_dir("record");
  BestTracker t(out, *parse_best_metric("eval/acc_0", 3));
  const std::string a = make_checkpoint(out, 0, 4);
  const std::string b = make_checkpoint(out, 1, 8);
  t.record(0.25, 4, 0, a);
  CHECK(checkpoint::link_target(out, checkpoint::kBestLink) == "epoch_0_step_4");
  t.record(0.5, 8, 1, b);
  CHECK(checkpoint::link_target(out, checkpoint::kBestLink) == "epoch_1_step_8");
  std::ifstream in(out + "/best/payload");
  int64_t step = 0;
  in >> step;
  CHECK(step == 8);
  CHECK_FALSE(fs::exists(out + "/.best.json.tmp"));
  CHECK_FALSE(fs::exists(fs::symlink_status(out + "/.best.tmp")));
  const auto r = read_best_record(out);
  REQUIRE(r);
  CHECK(r->metric == "eval/acc_0");
  CHECK(r->direction == "max");
  CHECK(r->step == 8);
  CHECK(r->epoch == 1);
  CHECK(r->value == 0.5);
  CHECK(r->checkpoint == "epoch_1_step_8");
  // The best is not what resume or discovery takes: the newest complete checkpoint is.
  const std::string c = make_checkpoint(out, 1, 12);
  CHECK(checkpoint::find_latest(out)->path == c);
  CHECK(checkpoint::list_complete(out).size() == 3);
  // --keep-last 1 keeps the newest and the best.
  checkpoint::prune(out, 1, c);
  CHECK_FALSE(fs::exists(a));
  CHECK(checkpoint::is_complete(b));
  CHECK(checkpoint::is_complete(c));
}

TEST_CASE("a resumed run reads its best back and keeps a better one", "[train]") {
  const std::string out = fresh_dir("resume");
  const std::string a = make_checkpoint(out, 0, 4);
  make_checkpoint(out, 0, 8);
  {
    BestTracker first(out, *parse_best_metric("eval/accept_len", 3));
    first.record(1.8, 4, 0, a);
  }
  BestTracker resumed(out, *parse_best_metric("eval/accept_len", 3));
  CHECK_THAT(resumed.resume(), Catch::Contains("epoch_0_step_4"));
  REQUIRE(resumed.best());
  CHECK(resumed.best()->value == 1.8);
  // A worse evaluation after the resume does not replace the better best of before it.
  CHECK_FALSE(resumed.improvement(eval_of("eval/accept_len", 1.5)));
  CHECK(resumed.improvement(eval_of("eval/accept_len", 1.9)) == 1.9);
  // A link lost between best.json and its replacement is put back on resume.
  fs::remove(out + "/best");
  BestTracker again(out, *parse_best_metric("eval/accept_len", 3));
  again.resume();
  CHECK(checkpoint::link_target(out, checkpoint::kBestLink) == "epoch_0_step_4");

  // Another metric starts anew; so does a best whose checkpoint is gone (another branch).
  BestTracker other(out, *parse_best_metric("eval/loss", 3));
  CHECK_THAT(other.resume(), Catch::Contains("starts anew"));
  CHECK_FALSE(other.best());
  fs::rename(a, a + ".superseded");
  BestTracker branch(out, *parse_best_metric("eval/accept_len", 3));
  CHECK_THAT(branch.resume(), Catch::Contains("starts anew"));
  CHECK_FALSE(branch.best());
  // No best.json: nothing to say. A damaged one: said, and the best starts anew.
  const std::string empty = fresh_dir("resume_empty");
  BestTracker none(empty, *parse_best_metric("eval/accept_len", 3));
  CHECK(none.resume().empty());
  std::ofstream(empty + "/best.json") << "{\"metric\": 3";
  CHECK_THAT(none.resume(), Catch::Contains("best.json") && Catch::Contains("starts anew"));
  CHECK_FALSE(none.best());
}

TEST_CASE("ploss or accuracy stuck at exactly 0 is said once per streak", "[train]") {
  ZeroMetricWatch w("eval", "evaluations", 3);
  const MetricScalars dead = {{"eval/ploss_0", 0}, {"eval/ploss_1", 0}, {"eval/acc_0", 0},
                              {"eval/acc_1", 0},   {"eval/loss", 0},    {"eval/accept_len", 1}};
  const MetricScalars alive = {
      {"eval/ploss_0", 2.1}, {"eval/ploss_1", 2.4}, {"eval/acc_0", 0.1}, {"eval/acc_1", 0.0}};
  CHECK(w.observe(dead).empty());
  CHECK(w.observe(dead).empty());
  const std::string line = w.observe(dead);
  CHECK_THAT(line, Catch::Contains("eval/ploss_*") && Catch::Contains("eval/acc_*") &&
                       Catch::Contains("3 consecutive evaluations") &&
                       Catch::Contains("loss masks") && Catch::Contains("chat template") &&
                       Catch::Contains("d2t") && Catch::Contains("Hint"));
  CHECK(w.observe(dead).empty());  // once per streak
  CHECK(w.observe(alive).empty());
  // Accuracy alone: every acc_i exactly 0 while the loss is not.
  const MetricScalars blind = {{"eval/ploss_0", 2.0}, {"eval/acc_0", 0}, {"eval/acc_1", 0}};
  CHECK(w.observe(blind).empty());
  CHECK(w.observe(blind).empty());
  const std::string acc_line = w.observe(blind);
  CHECK_THAT(acc_line, Catch::Contains("eval/acc_*") && Catch::Contains("has been exactly 0"));
  CHECK_THAT(acc_line, !Catch::Contains("ploss"));
  // A report without those metrics neither counts nor breaks a streak; one non-zero acc_i does.
  ZeroMetricWatch t("train", "logging steps", 2);
  CHECK(t.observe({{"train/lr", 0.0}}).empty());
  CHECK(t.observe({{"train/acc_0", 0}, {"train/acc_1", 0.01}}).empty());
  CHECK(t.observe({{"train/acc_0", 0}}).empty());
  CHECK(t.observe({{"train/lr", 0.0}}).empty());
  CHECK_THAT(t.observe({{"train/acc_0", 0}}), Catch::Contains("2 consecutive logging steps"));
}
