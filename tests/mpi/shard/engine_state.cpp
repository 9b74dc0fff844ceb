// State round trips: full tensors out and back in, and per-rank shard files saved at this world
// size and loaded at every smaller one (sub-communicators of the first M ranks): continuing
// gives the same weights as never stopping (bit-identical at the same size).
#include <catch2/catch.hpp>

#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>

#include "mpi/shard/groups.h"
#include "mpi/shard/tiny_model.h"
#include "support/test_paths.h"

using namespace fsdp;
using namespace fsdp::testing;
using shard::Strategy;

namespace {

std::string state_dir(const std::string& tag) {
  const auto& t = comm::topology();
  return std::string(FSDP_BINARY_DIR) + "/test-tmp/shard_state_" + tag + "_w" +
         std::to_string(t.world_size);
}

}  // namespace

TEST_CASE("full state round trip", "[mpi][shard]") {
  TrainSetup c;
  auto world = world_comm();
  TinyModel a(7);
  shard::ShardEngine ea(*a, groups_for(Strategy::kFullShard, world),
                        engine_options(Strategy::kFullShard, c));
  a->set_unit_hooks(&ea);
  const auto& t = comm::topology();
  train_engine(a, ea, t.world_rank, t.world_size, 0, 1, c);
  const auto full = ea.full_state(false);
  const auto only0 = ea.full_state(true);
  CHECK(only0.empty() == (t.world_rank != 0));
  TinyModel b(99);  // different initial weights, replaced by the load
  shard::ShardEngine eb(*b, groups_for(Strategy::kShardGradOp, world),
                        engine_options(Strategy::kShardGradOp, c));
  eb.load_full_state(full);
  const auto back = eb.full_state(false);
  for (const auto& [name, w] : full) CHECK(torch::equal(w, back.at(name)));
  std::map<std::string, torch::Tensor> bad = full;
  bad["mlp.0.weight"] = torch::zeros({3, 3});
  CHECK_THROWS_WITH(eb.load_full_state(bad), Catch::Contains("mlp.0.weight"));
  bad.erase("mlp.0.weight");
  CHECK_THROWS_WITH(eb.load_full_state(bad), Catch::Contains("missing"));
}

TEST_CASE("save at N ranks, load at M <= N ranks, continue", "[mpi][shard]") {
  TrainSetup c;
  const auto& t = comm::topology();
  auto world = world_comm();
  const std::string dir = state_dir("reshard");
  if (t.world_rank == 0) remove_tree(dir);
  world->barrier();

  TinyModel a(7);
  shard::ShardEngine ea(*a, groups_for(Strategy::kFullShard, world),
                        engine_options(Strategy::kFullShard, c));
  a->set_unit_hooks(&ea);
  train_engine(a, ea, t.world_rank, t.world_size, 0, 2, c);
  shard::save_state(ea, dir);
  {
    // The shard file is streamed to disk; its bytes are exactly torch::jit::pickle_save's of
    // the same dict (so every reader of the earlier format reads it).
    const std::vector<char> want =
        torch::jit::pickle_save(c10::IValue(shard::shard_state_dict(ea)));
    std::ifstream in(dir + "/shard_" + std::to_string(ea.shard_rank()) + ".pt", std::ios::binary);
    const std::vector<char> got((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
    CHECK(got.size() == want.size());
    CHECK(got == want);
  }
  train_engine(a, ea, t.world_rank, t.world_size, 2, 2, c);
  const auto never_stopped = ea.full_state(false);

  for (int m = 1; m <= t.world_size; ++m) {
    auto sub = split_comm(t.world_rank < m ? 0 : -1, t.world_rank, comm::Group::kWorld);
    if (sub) {
      INFO("loaded at " << m << " of " << t.world_size << " ranks");
      TinyModel b(123);
      shard::ShardEngine eb(*b, {sub, nullptr}, engine_options(Strategy::kFullShard, c));
      b->set_unit_hooks(&eb);
      shard::load_state(eb, dir);
      CHECK(eb.step_count() == 2);
      train_engine(b, eb, sub->rank(), m, 2, 2, c);
      const auto resumed = eb.full_state(false);
      if (m == t.world_size) {
        for (const auto& [name, w] : never_stopped) CHECK(torch::equal(w, resumed.at(name)));
      } else {
        CHECK(max_rel_diff(resumed, never_stopped) < 1e-5);
      }
    }
    world->barrier();
  }
  // A manifest for another model is refused with the file named.
  if (t.world_rank == 0) {
    TinyModel other(7, 1);
    shard::EngineOptions o = engine_options(Strategy::kFullShard, c);
    o.units = {"embed", "mlp", "head", "block"};
    // Same parameters, different unit order: the flat layouts still match per unit.
    shard::ShardEngine eo(*other, {}, o);
    CHECK_NOTHROW(shard::load_state(eo, dir));
    shard::EngineOptions merged = engine_options(Strategy::kFullShard, c);
    TinyModel third(7);
    merged.units = {"embed", "mlp", "block", "head.lm_head", "head.norm", "head.frozen_proj"};
    shard::ShardEngine et(*third, {}, merged);
    CHECK_THROWS_WITH(shard::load_state(et, dir), Catch::Contains("manifest.txt"));
  }
  world->barrier();
}
