// Checkpoint directories: names, discovery of complete ones only, atomic commit (marker last,
// temporary directory renamed), replacing a checkpoint of the same name, keep-last pruning, and
// weights-only (SpecForge) directories told apart from checkpoints.
#include "checkpoint/checkpoint_dir.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "core/fs_util.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using namespace fsdp::checkpoint;

namespace {
std::string fresh_dir(const std::string& name) {
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test-scratch/checkpoint/" + name;
  fsdp::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

std::string save(const std::string& out, int64_t epoch, int64_t step, const std::string& text,
                 int64_t keep_last = 0) {
  CheckpointWriter w(out, epoch, step);
  w.begin();
  std::ofstream(w.temp_dir() + "/payload") << text;
  return w.commit(keep_last);
}

std::string payload(const std::string& dir) {
  std::ifstream in(dir + "/payload");
  std::string s;
  std::getline(in, s);
  return s;
}
}  // namespace

TEST_CASE("checkpoint names parse back; odd names are not checkpoints", "[checkpoint]") {
  CHECK(checkpoint_name(3, 120) == "epoch_3_step_120");
  const auto r = parse_checkpoint_name("epoch_3_step_120");
  REQUIRE(r);
  CHECK(r->epoch == 3);
  CHECK(r->step == 120);
  for (const char* bad :
       {"epoch_3", "epoch_3_step_", ".tmp_epoch_3_step_1", "epoch_3_step_1.old", "epoch_x_step_1"})
    CHECK_FALSE(parse_checkpoint_name(bad));
}

TEST_CASE("commit publishes atomically; discovery sees complete checkpoints only", "[checkpoint]") {
  const std::string out = fresh_dir("commit");
  CHECK_FALSE(find_latest(out));
  CheckpointWriter pending(out, 0, 5);
  pending.begin();  // an interrupted save: temporary directory, no marker
  save(out, 0, 2, "two");
  save(out, 1, 10, "ten");
  fs::create_directories(out + "/epoch_1_step_12");  // a final name without the marker
  const auto all = list_complete(out);
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 2);
  CHECK(all[1].step == 10);
  CHECK(find_latest(out)->path == out + "/epoch_1_step_10");
  CHECK(is_complete(out + "/epoch_1_step_10"));
  CHECK_FALSE(is_complete(out + "/epoch_1_step_12"));
  // The next begin() of the interrupted name starts from an empty temporary directory.
  std::ofstream(pending.temp_dir() + "/stale") << "x";
  CheckpointWriter again(out, 0, 5);
  again.begin();
  CHECK_FALSE(fs::exists(again.temp_dir() + "/stale"));
}

TEST_CASE("the same name saved again replaces the earlier checkpoint", "[checkpoint]") {
  const std::string out = fresh_dir("replace");
  save(out, 0, 4, "first");
  const std::string dir = save(out, 0, 4, "second");
  CHECK(payload(dir) == "second");
  CHECK(is_complete(dir));
  CHECK_FALSE(fs::exists(dir + ".old"));
  CHECK(list_complete(out).size() == 1);
}

TEST_CASE("keep-last prunes the oldest complete checkpoints, never the new one", "[checkpoint]") {
  const std::string out = fresh_dir("prune");
  for (int64_t step : {2, 4, 6}) save(out, 0, step, std::to_string(step), /*keep_last=*/2);
  auto all = list_complete(out);
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 4);
  CHECK(all[1].step == 6);
  // prune() directly: keep 1, and the named one survives even when it is not the newest.
  const auto removed = prune(out, 1, out + "/epoch_0_step_4");
  CHECK(removed == std::vector<std::string>{});
  CHECK(list_complete(out).size() == 2);
  CHECK(prune(out, 1).size() == 1);
  CHECK(find_latest(out)->step == 6);
}

TEST_CASE("keep-last never follows a symbolic link named like a checkpoint", "[checkpoint]") {
  // A complete checkpoint elsewhere, linked into the output directory under an old name.
  const std::string elsewhere = fresh_dir("prune-link-target");
  const std::string target = save(elsewhere, 0, 1, "precious");
  const std::string out = fresh_dir("prune-link");
  fs::create_directory_symlink(target, out + "/epoch_0_step_1");
  for (int64_t step : {2, 4, 6}) save(out, 0, step, std::to_string(step), /*keep_last=*/1);
  // The link and everything it points at survive; the real old checkpoints are pruned.
  CHECK(fs::is_symlink(out + "/epoch_0_step_1"));
  CHECK(is_complete(target));
  CHECK(payload(target) == "precious");
  CHECK_FALSE(fs::exists(out + "/epoch_0_step_2"));
  CHECK_FALSE(fs::exists(out + "/epoch_0_step_4"));
  CHECK(is_complete(out + "/epoch_0_step_6"));
  CHECK(prune(out, 1).empty());
  CHECK(is_complete(target));
}

TEST_CASE("best and latest links: replaced atomically, never taken for checkpoints",
          "[checkpoint]") {
  const std::string out = fresh_dir("links");
  const std::string s2 = save(out, 0, 2, "two");
  const std::string s4 = save(out, 0, 4, "four");
  CHECK(link_target(out, kBestLink).empty());
  point_link(out, kBestLink, s2);
  point_link(out, kLatestLink, s2);
  CHECK(fs::is_symlink(out + "/best"));
  CHECK(fs::read_symlink(out + "/best") == "epoch_0_step_2");  // relative: the directory can move
  CHECK(payload(out + "/best") == "two");
  // Replaced by a rename over the old link: no temporary link is left.
  point_link(out, kLatestLink, s4);
  CHECK(link_target(out, kLatestLink) == "epoch_0_step_4");
  CHECK(payload(out + "/latest") == "four");
  CHECK_FALSE(fs::exists(fs::symlink_status(out + "/.latest.tmp")));
  // A temporary link left by an interrupted replacement, and best.json, change nothing either.
  fs::create_directory_symlink("epoch_0_step_2", out + "/.best.tmp");
  std::ofstream(out + "/best.json") << "{}";
  // Discovery, resume and the other listings see the two checkpoints only: the links are not
  // checkpoints, and the best is not taken unless it is the newest.
  const auto all = list_complete(out);
  REQUIRE(all.size() == 2);
  CHECK(all[0].path == s2);
  CHECK(all[1].path == s4);
  CHECK(find_latest(out)->path == s4);
  CHECK(list_foreign_exports(out).empty());
  CHECK(recover_interrupted_saves(out).empty());
  CHECK(set_aside_newer(out, 4).empty());
  point_link(out, kBestLink, s2);  // over the leftover temporary link
  CHECK(link_target(out, kBestLink) == "epoch_0_step_2");
  // A directory named like a link is not replaced.
  fs::create_directories(out + "/notalink/x");
  CHECK_THROWS(point_link(out, "notalink", s4));
  CHECK(fs::is_directory(out + "/notalink/x"));
}

TEST_CASE("keep-last never removes the best checkpoint", "[checkpoint]") {
  const std::string out = fresh_dir("prune-best");
  const std::string s2 = save(out, 0, 2, "two");
  point_link(out, kBestLink, s2);
  for (int64_t step : {4, 6, 8}) save(out, 0, step, std::to_string(step), /*keep_last=*/2);
  // The newest two and the best besides.
  std::vector<int64_t> steps;
  for (const auto& c : list_complete(out)) steps.push_back(c.step);
  CHECK(steps == std::vector<int64_t>{2, 6, 8});
  CHECK(payload(out + "/best") == "two");
  // The best moves on: the old one is an ordinary checkpoint again.
  point_link(out, kBestLink, out + "/epoch_0_step_6");
  CHECK(prune(out, 1) == std::vector<std::string>{s2});
  steps.clear();
  for (const auto& c : list_complete(out)) steps.push_back(c.step);
  CHECK(steps == std::vector<int64_t>{6, 8});
  CHECK(payload(out + "/best") == "6");
}

TEST_CASE("weights-only directories are not checkpoints, and are listed apart", "[checkpoint]") {
  const std::string out = fresh_dir("foreign");
  for (const char* name : {"epoch_3", "epoch_0_step_7"}) {
    fs::create_directories(out + "/" + name);
    std::ofstream(out + "/" + name + "/config.json") << "{}";
    std::ofstream(out + "/" + name + "/model.safetensors") << "x";
  }
  fs::create_directories(out + "/epoch_9");  // no files: not an export
  save(out, 1, 8, "ours");
  CHECK(list_complete(out).size() == 1);
  CHECK(list_foreign_exports(out) ==
        std::vector<std::string>{out + "/epoch_0_step_7", out + "/epoch_3"});
}

TEST_CASE("what interrupted saves left is put back or removed; the output lock is exclusive",
          "[checkpoint]") {
  const std::string out = fresh_dir("recover");
  save(out, 0, 2, "two");
  save(out, 0, 4, "four");
  save(out, 0, 6, "six");
  // A replacement of step 2 cut after moving it aside: only epoch_0_step_2.old is left.
  fs::rename(out + "/epoch_0_step_2", out + "/epoch_0_step_2.old");
  // A replacement of step 4 cut after the new one took its place: both exist.
  fs::create_directories(out + "/epoch_0_step_4.old");
  // A save cut before its commit.
  fs::create_directories(out + "/.tmp_epoch_0_step_8");
  const auto actions = recover_interrupted_saves(out);
  CHECK(actions.size() == 3);
  CHECK(payload(out + "/epoch_0_step_2") == "two");
  CHECK(!fs::exists(out + "/epoch_0_step_2.old"));
  CHECK(!fs::exists(out + "/epoch_0_step_4.old"));
  CHECK(payload(out + "/epoch_0_step_4") == "four");
  CHECK(!fs::exists(out + "/.tmp_epoch_0_step_8"));
  CHECK(list_complete(out).size() == 3);
  CHECK(recover_interrupted_saves(out).empty());

  OutputDirLock first(out);
  CHECK(first.acquire().empty());
  CHECK(first.held());
  OutputDirLock second(out);  // another open file description: flock excludes it
  const std::string holder = second.acquire();
  CHECK(holder.find("pid ") == 0);
  CHECK(!second.held());
}
