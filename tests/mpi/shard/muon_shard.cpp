// Muon on sharded parameters (shard/muon_shard.h) at 1-4 ranks: a flat buffer of matrices and a
// vector split over the world, three steps, every rank's shard equal bit for bit to
// optim::muon_update on the whole matrices (itself bitwise torch.optim.Muon: e2e.torch_muon);
// and the round-robin owners orthogonalise each matrix once, spread evenly.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <map>

#include "mpi/shard/groups.h"
#include "optim/muon.h"
#include "shard/muon_shard.h"
#include "shard/shard_plan.h"

using namespace fsdp;

TEST_CASE("muon on shards equals muon on whole matrices", "[mpi][shard][muon]") {
  auto world = testing::world_comm();
  const int W = world->size(), R = world->rank();
  const std::vector<shard::ParamSpec> specs = {
      {"a.weight", {6, 10}}, {"norm.weight", {10}}, {"b.weight", {9, 4}}, {"c.weight", {5, 5}}};
  const shard::FlatLayout layout = shard::make_flat_layout("u", true, specs, W);
  const std::vector<int> muon_params = {0, 2, 3};
  optim::MuonOptions o;
  const double lr = 0.02;
  torch::manual_seed(17);  // the same full tensors on every rank
  std::vector<at::Tensor> full, bufs;
  for (const auto& s : specs) full.push_back(torch::randn(s.shape));
  std::vector<std::vector<at::Tensor>> grads(3);
  for (auto& g : grads)
    for (const auto& s : specs) g.push_back(torch::randn(s.shape) * 0.1);
  // Reference: whole matrices.
  std::vector<at::Tensor> ref;
  for (const auto& t : full) ref.push_back(t.clone());
  for (const auto& t : full) bufs.push_back(torch::zeros_like(t));
  // Sharded: this rank's slices of the padded flat buffers.
  auto flat = [&](const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> parts;
    for (const auto& t : ts) parts.push_back(t.reshape({-1}));
    at::Tensor f = torch::zeros({layout.padded_numel});
    f.narrow(0, 0, layout.numel).copy_(at::cat(parts));
    return f.narrow(0, layout.shard_begin(R), layout.shard_numel).clone();
  };
  at::Tensor master = flat(full), momentum = torch::zeros({layout.shard_numel});
  for (int s = 0; s < 3; ++s) {
    for (int pi : muon_params)
      optim::muon_update(ref[static_cast<size_t>(pi)], grads[s][static_cast<size_t>(pi)],
                         bufs[static_cast<size_t>(pi)], lr, o);
    shard::muon_shard_step(layout, R, *world, master, flat(grads[s]), momentum, muon_params, 0, lr,
                           o);
  }
  // The vector was not Muon's: unchanged in both.
  const at::Tensor want = flat(ref);
  CHECK(at::equal(master, want));
  CHECK(at::equal(momentum, [&] {
    std::vector<at::Tensor> m(bufs);
    m[1] = torch::zeros({10});
    return flat(m);
  }()));
}

TEST_CASE("muon owners: each matrix once, spread over the ranks", "[mpi][shard][muon]") {
  for (int world = 1; world <= 4; ++world) {
    std::map<int, int> per_rank;
    for (int64_t m = 0; m < 11; ++m) {
      const int owner = shard::muon_owner(m, world);
      CHECK(owner >= 0);
      CHECK(owner < world);
      ++per_rank[owner];
    }
    int lo = 1 << 30, hi = 0;
    for (int r = 0; r < world; ++r) {
      lo = std::min(lo, per_rank[r]);
      hi = std::max(hi, per_rank[r]);
    }
    CHECK(hi - lo <= 1);
  }
}
