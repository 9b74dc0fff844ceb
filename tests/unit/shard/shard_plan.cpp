// Shard plan arithmetic: padding, per-rank pieces covering every parameter exactly once, and
// resharding segments that rebuild the same content at any new group size.
#include <catch2/catch.hpp>

#include <numeric>

#include "shard/shard_plan.h"

using namespace fsdp::shard;

namespace {
std::vector<ParamSpec> specs() {
  return {{"a.weight", {3, 5}, true}, {"a.norm", {7}, false}, {"b.weight", {2, 2, 2}, true}};
}
}  // namespace

TEST_CASE("layout offsets and padding", "[shard]") {
  FlatLayout l = make_flat_layout("u", true, specs(), 4);
  REQUIRE(l.numel == 30);
  REQUIRE(l.padded_numel == 32);
  REQUIRE(l.shard_numel == 8);
  REQUIRE(l.params[1].offset == 15);
  REQUIRE(l.params[2].offset == 22);
  REQUIRE(l.valid_numel(3) == 6);
  REQUIRE(l.valid_numel(0) == 8);
  REQUIRE(l.key() == "u/trainable");
  REQUIRE(padded_size(0, 3) == 0);
  const FlatLayout tiny = make_flat_layout("x", false, {{"p", {5}, true}}, 8);
  REQUIRE(tiny.valid_numel(4) == 1);
  REQUIRE(tiny.valid_numel(5) == 0);
}

TEST_CASE("shard pieces cover every parameter element once", "[shard]") {
  for (int group = 1; group <= 7; ++group) {
    FlatLayout l = make_flat_layout("u", true, specs(), group);
    std::vector<int> seen(l.numel, 0);
    for (int r = 0; r < group; ++r) {
      int64_t prev_end = 0;
      for (const ShardPiece& p : shard_pieces(l, r)) {
        REQUIRE(p.shard_offset >= prev_end);
        prev_end = p.shard_offset + p.length;
        REQUIRE(prev_end <= l.shard_numel);
        const int64_t flat = l.params[p.param].offset + p.param_offset;
        REQUIRE(flat == l.shard_begin(r) + p.shard_offset);
        for (int64_t i = 0; i < p.length; ++i) seen[flat + i]++;
      }
    }
    for (int v : seen) REQUIRE(v == 1);
  }
}

TEST_CASE("reshard segments rebuild the content at a new group size", "[shard]") {
  const int64_t numel = 30;
  for (int old_g = 1; old_g <= 5; ++old_g) {
    const int64_t old_s = padded_size(numel, old_g) / old_g;
    // Old shards hold value = flat index (padding -1).
    std::vector<std::vector<int64_t>> old(old_g, std::vector<int64_t>(old_s, -1));
    for (int64_t i = 0; i < numel; ++i) old[i / old_s][i % old_s] = i;
    for (int new_g = 1; new_g <= 5; ++new_g) {
      const int64_t new_s = padded_size(numel, new_g) / new_g;
      for (int r = 0; r < new_g; ++r) {
        std::vector<int64_t> shard(new_s, -1);
        for (const auto& s : reshard_segments(numel, old_s, new_s, r)) {
          for (int64_t i = 0; i < s.length; ++i)
            shard[s.dst_offset + i] = old[s.src_rank][s.src_offset + i];
        }
        for (int64_t i = 0; i < new_s; ++i) {
          const int64_t flat = r * new_s + i;
          REQUIRE(shard[i] == (flat < numel ? flat : -1));
        }
      }
    }
  }
}
