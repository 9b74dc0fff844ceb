// The agreement on a failed micro-batch read, with a fake read and a fake agreement (no MPI):
// who runs the save-before-failure hook, who rethrows, who stops with a usage error.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "core/error.h"
#include "data/dataset.h"
#include "train/step_runner.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {
data::Batch one_batch() {
  data::Batch b;
  b.batch_index = 3;
  return b;
}
ReadAgreement agree(int world, bool others_failed, int* calls) {
  ReadAgreement a;
  a.world = world;
  a.other_rank_wait = std::chrono::seconds(0);
  a.any_rank = [=](bool mine) {
    ++*calls;
    return mine || others_failed;
  };
  return a;
}
}  // namespace

TEST_CASE("a good read passes through, agreed once per micro-batch", "[train]") {
  int calls = 0, hooks = 0;
  auto b = read_agreed([] { return std::optional<data::Batch>(one_batch()); },
                       agree(2, false, &calls), "data loading", [&](ReadFailure) { ++hooks; });
  REQUIRE(b);
  CHECK(b->batch_index == 3);
  CHECK(calls == 1);
  CHECK(hooks == 0);
  // The end of the data is not a failure.
  CHECK(
      !read_agreed([] { return std::optional<data::Batch>(); }, agree(2, false, &calls), "x", {}));
  // One rank: no collective at all.
  calls = 0;
  CHECK(read_agreed([] { return std::optional<data::Batch>(one_batch()); }, agree(1, false, &calls),
                    "x", {}));
  CHECK(calls == 0);
}

TEST_CASE("a failing rank runs the hook, then rethrows its own error", "[train]") {
  for (int world : {1, 2}) {
    int calls = 0;
    ReadFailure seen = ReadFailure::kOtherRank;
    CHECK_THROWS_AS(
        read_agreed([]() -> std::optional<data::Batch> { throw std::runtime_error("disk gone"); },
                    agree(world, false, &calls), "data loading",
                    [&](ReadFailure why) { seen = why; }),
        std::runtime_error);
    CHECK(seen == ReadFailure::kLoaderError);
  }
}

TEST_CASE("a peer's failure: the hook, then a usage error naming what failed", "[train]") {
  int calls = 0, hooks = 0;
  ReadFailure seen = ReadFailure::kBadSample;
  try {
    read_agreed([] { return std::optional<data::Batch>(one_batch()); }, agree(3, true, &calls),
                "evaluation data loading",
                [&](ReadFailure why) {
                  seen = why;
                  ++hooks;
                });
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).find("evaluation data loading") != std::string::npos);
  }
  CHECK(hooks == 1);
  CHECK(seen == ReadFailure::kOtherRank);
}

TEST_CASE("a bad sample is told apart from other loader errors", "[train]") {
  int calls = 0;
  ReadFailure seen = ReadFailure::kOtherRank;
  CHECK_THROWS_AS(
      read_agreed(
          []() -> std::optional<data::Batch> {
            throw data::BadSampleError("sample 7 is bad", "fix it", __FILE__, __LINE__);
          },
          agree(2, false, &calls), "data loading", [&](ReadFailure why) { seen = why; }),
      data::BadSampleError);
  CHECK(seen == ReadFailure::kBadSample);
}
