// The streaming spool's bookkeeping (data/stream_order.h, data/spool.h): which arrival each
// position trains, when a position is known, where the stream ends, what a checkpoint
// acknowledges; the ledger's torn-line recovery; the scanner's view of renamed, locked, hidden and
// foreign files and of the end marker; deletion only on acknowledgement; the budget's checkpoint
// request; the loader's end of a stream (the last micro-batch marked, nothing past it).
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "data/loader.h"
#include "data/sampler.h"
#include "data/spool.h"
#include "data/stream_order.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;

namespace {

StreamOrder order_of(int64_t uses, int64_t window, int64_t round, uint64_t seed = 7) {
  return StreamOrder({uses, window, round, seed});
}

// Waits (bounded) until `pred` holds: the scanner thread works on its own clock.
template <typename P>
bool eventually(P pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

void publish(const fs::path& dir, const std::string& name, int64_t tag) {
  const fs::path tmp = dir / ("." + name + ".tmp");
  write_ckpt(tmp, make_sample(8, 4, tag));
  fs::rename(tmp, dir / name);
}

SpoolOptions options_in(const fs::path& dir, bool scans = true) {
  SpoolOptions o;
  o.dir = dir.string();
  o.owner = "/runs/a";
  o.poll_seconds = 0.005;
  o.dataset.hidden_size = 4;
  o.dataset.vocab_size = 1000;
  o.scans = scans;
  return o;
}

}  // namespace

TEST_CASE("one use: position p trains arrival p, known once it arrived") {
  const StreamOrder o = order_of(1, 64, 1);
  CHECK(o.at(0, 0, false).state == StreamOrder::State::kWaiting);
  CHECK(o.at(0, 0, false).arrivals_needed == 1);
  CHECK(o.at(3, 4, false).state == StreamOrder::State::kKnown);
  CHECK(o.at(3, 4, false).arrival == 3);
  CHECK(o.at(4, 4, false).state == StreamOrder::State::kWaiting);
  CHECK(o.at(4, 4, true).state == StreamOrder::State::kEnded);
  CHECK(o.acknowledged(3, 10, false) == 3);
  CHECK(o.acknowledged(12, 10, false) == 10);
}

TEST_CASE("the stream ends on whole rounds; the rest is acknowledged at the end") {
  const StreamOrder o = order_of(1, 1, 4);  // micro-batch 2 x 2 ranks
  CHECK(o.trained_positions(10) == 8);
  CHECK(o.at(7, 10, true).state == StreamOrder::State::kKnown);
  CHECK(o.at(8, 10, true).state == StreamOrder::State::kEnded);
  // Before the end is known, position 8 is trainable.
  CHECK(o.at(8, 10, false).state == StreamOrder::State::kKnown);
  CHECK(o.acknowledged(8, 10, false) == 8);
  CHECK(o.acknowledged(8, 10, true) == 10);  // 8 and 9 are never trained
  CHECK(o.acknowledged(7, 10, true) == 7);
}

TEST_CASE("K uses: each window trains its samples K times, then the next window starts") {
  const int64_t K = 3, R = 4;
  const StreamOrder o = order_of(K, R, 1);
  std::vector<int64_t> seen;
  for (int64_t p = 0; p < 2 * R * K; ++p) {
    const auto l = o.at(p, 2 * R, false);
    REQUIRE(l.state == StreamOrder::State::kKnown);
    seen.push_back(l.arrival);
  }
  for (int64_t w = 0; w < 2; ++w) {
    for (int64_t pass = 0; pass < K; ++pass) {
      std::multiset<int64_t> got(seen.begin() + w * R * K + pass * R,
                                 seen.begin() + w * R * K + (pass + 1) * R);
      std::multiset<int64_t> want;
      for (int64_t j = 0; j < R; ++j) want.insert(w * R + j);
      CHECK(got == want);  // each pass is a permutation of its window
      if (pass == 0) {     // the first in arrival order
        for (int64_t j = 0; j < R; ++j) CHECK(seen[w * R * K + j] == w * R + j);
      }
    }
  }
  // Later passes are shuffled (a fixed seed: this permutation is not the identity).
  CHECK(replay_permutation(7, 0, 1, 16) != replay_permutation(7, 0, 2, 16));
  // The first pass follows the arrivals; the second needs the whole window.
  CHECK(o.at(1, 2, false).arrival == 1);
  CHECK(o.at(R, R - 1, false).state == StreamOrder::State::kWaiting);
  CHECK(o.at(R, R - 1, false).arrivals_needed == R);
  // A window is acknowledged only after its K-th pass.
  CHECK(o.acknowledged(R * K - 1, 2 * R, false) == 0);
  CHECK(o.acknowledged(R * K, 2 * R, false) == R);
}

TEST_CASE("K uses: a stream ending inside a window trains that shorter window K times") {
  const StreamOrder o = order_of(2, 4, 1);
  // 6 arrivals: window 0 (4 samples, 8 positions), window 1 (2 samples, 4 positions).
  CHECK(o.trained_positions(6) == 12);
  std::multiset<int64_t> last;
  for (int64_t p = 8; p < 12; ++p) {
    const auto l = o.at(p, 6, true);
    REQUIRE(l.state == StreamOrder::State::kKnown);
    last.insert(l.arrival);
  }
  CHECK(last == std::multiset<int64_t>{4, 4, 5, 5});
  CHECK(o.at(12, 6, true).state == StreamOrder::State::kEnded);
  CHECK(o.acknowledged(12, 6, true) == 6);
  CHECK(o.acknowledged(11, 6, true) == 4);
}

TEST_CASE("the ledger drops a torn last line and keeps its owner") {
  const fs::path dir = temp_dir("spool_ledger");
  const std::string path = (dir / "ledger").string();
  {
    SpoolLedger w(path);
    w.start("/runs/a");
    w.append_arrivals({{"x.ckpt", 10}, {"y.ckpt", 20}});
  }
  {
    std::ofstream out(path, std::ios::app);
    out << "A z.ck";  // the trainer died inside a write
  }
  SpoolLedger r(path);
  CHECK(r.arrivals().size() == 2);
  SpoolLedger w(path);
  w.start("/runs/a");
  CHECK(w.owner() == "/runs/a");
  w.append_arrivals({{"z.ckpt", 30}});
  w.append_acknowledged(1);
  w.append_end(3);
  SpoolLedger again(path);
  REQUIRE(again.arrivals().size() == 3);
  CHECK(again.arrivals()[2].name == "z.ckpt");
  CHECK(again.arrivals()[2].bytes == 30);
  CHECK(again.acknowledged() == 1);
  CHECK(again.ended());
}

TEST_CASE("the scanner takes renamed samples in order, never hidden, locked or foreign files") {
  const fs::path dir = temp_dir("spool_scan");
  auto spool = std::make_shared<Spool>(options_in(dir));
  publish(dir, "a_0.ckpt", 0);
  REQUIRE(eventually([&] { return spool->stats().arrivals == 1; }));
  write_ckpt(dir / ".b_1.ckpt.tmp", make_sample(8, 4, 1));  // being written
  { std::ofstream(dir / "c_2.ckpt.lock") << ""; }           // vLLM writes it in place, under a lock
  write_ckpt(dir / "c_2.ckpt", make_sample(8, 4, 2));
  { std::ofstream(dir / "notes.txt") << "hello"; }  // not a sample
  publish(dir, "d_3.ckpt", 3);
  REQUIRE(eventually([&] { return spool->stats().arrivals == 2; }));
  fs::remove(dir / "c_2.ckpt.lock");
  REQUIRE(eventually([&] { return spool->stats().arrivals == 3; }));
  CHECK(fs::path(spool->path_of(0)).filename() == "a_0.ckpt");
  CHECK(fs::path(spool->path_of(1)).filename() == "d_3.ckpt");
  CHECK(fs::path(spool->path_of(2)).filename() == "c_2.ckpt");
  // The budget file counts every regular file in the directory, the one being written too.
  std::ifstream room(dir / ".spool" / "room.json");
  CHECK(room.good());
  // A second trainer on the same spool is refused by name.
  CHECK(error_of([&] { Spool other(options_in(dir)); }).find("another trainer") !=
        std::string::npos);
  // Another run's ledger is refused once this one is gone.
  spool.reset();
  SpoolOptions o = options_in(dir);
  o.owner = "/runs/b";
  CHECK(error_of([&] { Spool other(o); }).find("/runs/a") != std::string::npos);
}

TEST_CASE("a directory of samples that was never declared a spool is refused") {
  const fs::path dir = temp_dir("spool_dump");
  write_ckpt(dir / "rows_0-8" / "data_0.ckpt", make_sample(8, 4, 0));
  CHECK(error_of([&] { Spool s(options_in(dir)); }).find("not a spool") != std::string::npos);
  CHECK(fs::exists(dir / "rows_0-8" / "data_0.ckpt"));
  fs::create_directories(dir / ".spool");  // declared: its samples arrive (from a subdirectory)
  Spool s(options_in(dir));
  REQUIRE(eventually([&] { return s.stats().arrivals == 1; }));
  CHECK(fs::path(s.path_of(0)) == dir / "rows_0-8" / "data_0.ckpt");
}

TEST_CASE("acknowledgement deletes exactly the samples a checkpoint covers; the end drains") {
  const fs::path dir = temp_dir("spool_ack");
  SpoolOptions o = options_in(dir);
  o.budget_bytes = 1;  // any unacknowledged consumed sample asks for a checkpoint
  auto spool = std::make_shared<Spool>(o);
  for (int k = 0; k < 5; ++k) publish(dir, "s_" + std::to_string(k) + ".ckpt", k);
  REQUIRE(eventually([&] { return spool->stats().arrivals == 5; }));
  CHECK_FALSE(spool->wants_checkpoint(0));
  CHECK(spool->wants_checkpoint(2));
  CHECK(spool->acknowledge(2) == 2);
  CHECK_FALSE(fs::exists(dir / "s_0.ckpt"));
  CHECK_FALSE(fs::exists(dir / "s_1.ckpt"));
  CHECK(fs::exists(dir / "s_2.ckpt"));
  CHECK_FALSE(spool->wants_checkpoint(2));
  // An older checkpoint (1 consumed) can no longer resume: its sample 1 is gone.
  CHECK(error_of([&] { spool->check_resumable(1, "ckpt_1"); }).find("acknowledged") !=
        std::string::npos);
  spool->check_resumable(3, "ckpt_3");
  // The loader's view: positions 2..4 read after a resume at 2, then the end.
  SpoolDataset ds(spool, 100);
  CHECK(ds.read(2).input_ids[0].item<int64_t>() == 2);
  { std::ofstream(dir / kEndOfStreamFile) << ""; }
  REQUIRE(eventually([&] { return spool->stats().ended; }));
  CHECK_THROWS_AS(ds.read(5), StreamEnded);
  CHECK(spool->acknowledge(100) == 5);  // the run's whole capacity, past the end
  for (int k = 0; k < 5; ++k) CHECK_FALSE(fs::exists(dir / ("s_" + std::to_string(k) + ".ckpt")));
}

TEST_CASE("a stream's loader marks its last micro-batch and ends there") {
  const fs::path dir = temp_dir("spool_loader");
  auto spool = std::make_shared<Spool>(options_in(dir));
  for (int k = 0; k < 7; ++k) publish(dir, "s_" + std::to_string(k) + ".ckpt", k);
  { std::ofstream(dir / kEndOfStreamFile) << ""; }
  REQUIRE(eventually([&] { return spool->stats().ended; }));
  auto ds = std::make_shared<SpoolDataset>(spool, 100);
  LoaderOptions lo;
  lo.stream = true;
  lo.accumulation = 2;  // micro-batch 2 (the last) ends a step anyway: only 0 and 1 look ahead
  lo.prefetch_depth = 2;
  lo.max_length = 64;
  DataLoader loader(ds, DistributedSampler(100, 0, 1, 2, 0, /*shuffle=*/false), lo);
  loader.start({0, 0});
  std::vector<int64_t> ids;
  std::vector<bool> last;
  while (auto b = loader.next()) {
    for (int64_t r = 0; r < b->batch_size(); ++r) ids.push_back(b->sample_indices[r]);
    last.push_back(b->ends_stream);
  }
  CHECK(ids == std::vector<int64_t>{0, 1, 2, 3, 4, 5});  // the 7th fills no micro-batch of 2
  CHECK(last == std::vector<bool>{false, false, true});  // batch 2 closes no step: marked
  CHECK(loader.stream_ended());
}

TEST_CASE("a reader waiting for a sample that never comes is released at shutdown") {
  const fs::path dir = temp_dir("spool_shutdown");
  auto spool = std::make_shared<Spool>(options_in(dir));
  auto ds = std::make_shared<SpoolDataset>(spool, 100);
  {
    LoaderOptions lo;
    lo.stream = true;
    lo.prefetch_depth = 2;
    DataLoader loader(ds, DistributedSampler(100, 0, 1, 1, 0, false), lo);
    loader.start({0, 0});
  }  // the destructor joins the reader blocked in wait_for
  CHECK_THROWS_AS(spool->wait_for(0), StreamInterrupted);
}
