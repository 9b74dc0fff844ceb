// Muon on sharded parameters (shard/muon_shard.h) at 1-4 ranks: a flat buffer of matrices and a
// vector split over the world, three steps, every rank's shard equal bit for bit to
// optim::muon_update on the whole matrices (itself bitwise torch.optim.Muon: e2e.torch_muon);
// and the round-robin owners orthogonalise each matrix once, spread evenly.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <map>

#include "mpi/shard/groups.h"
#include "mpi/shard/tiny_model.h"
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
    shard::muon_shard_step(layout, R, world.get(), master, flat(grads[s]), momentum, muon_params, 0,
                           lr, o);
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

namespace {

// The plain LibTorch reference of --optimizer muon on the whole model: torch's AdamW for the
// pieces optim::muon_group leaves to it (at lr, or lr * ratio with Muon's weight decay),
// optim::muon_update (bitwise torch.optim.Muon) for the matrices, after clip_grad_norm_.
std::map<std::string, torch::Tensor> muon_reference(int steps, const testing::TrainSetup& c,
                                                    const optim::MuonOptions& o, double ratio) {
  testing::TinyModel m(7);
  std::vector<torch::Tensor> decay, no_decay, scaled, trainable, muon, bufs;
  for (const auto& p : m->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    trainable.push_back(p.value());
    switch (optim::muon_group(p.key(), p.value().sizes().vec())) {
      case optim::MuonGroup::kMuon:
        muon.push_back(p.value());
        bufs.push_back(torch::zeros_like(p.value()));
        break;
      case optim::MuonGroup::kAdamWAtMuonLr:
        scaled.push_back(p.value());
        break;
      case optim::MuonGroup::kAdamW:
        (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
    }
  }
  using torch::optim::AdamWOptions;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      decay, std::make_unique<AdamWOptions>(AdamWOptions(c.lr).weight_decay(c.weight_decay)));
  groups.emplace_back(no_decay,
                      std::make_unique<AdamWOptions>(AdamWOptions(c.lr).weight_decay(0.0)));
  groups.emplace_back(scaled, std::make_unique<AdamWOptions>(
                                  AdamWOptions(c.lr * ratio).weight_decay(o.weight_decay)));
  torch::optim::AdamW opt(std::move(groups), AdamWOptions(c.lr));
  for (int s = 0; s < steps; ++s) {
    testing::Batch b = testing::global_batch(s);
    auto logits = m->forward(b.ids);
    torch::nn::functional::cross_entropy(logits.reshape({-1, testing::kVocab}),
                                         b.targets.reshape({-1}))
        .backward();
    if (c.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(trainable, c.max_grad_norm);
    opt.step();
    for (size_t i = 0; i < muon.size(); ++i)
      optim::muon_update(muon[i].detach(), muon[i].grad(), bufs[i], c.lr * ratio, o);
    opt.zero_grad();
    for (auto& p : muon) p.mutable_grad() = torch::Tensor();
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

std::map<std::string, torch::Tensor> muon_engine_run(shard::Strategy s, shard::CommGroups g,
                                                     const testing::TrainSetup& c, int steps,
                                                     const optim::MuonOptions& o, double ratio) {
  const auto& t = comm::topology();
  testing::TinyModel m(7);
  auto eo = testing::engine_options(s, c);
  eo.muon = true;
  eo.muon_options = o;
  eo.muon_lr_ratio = ratio;
  shard::ShardEngine e(*m, std::move(g), eo);
  m->set_unit_hooks(&e);
  for (const auto& r : testing::train_engine(m, e, t.world_rank, t.world_size, 0, steps, c))
    REQUIRE_FALSE(r.skipped);
  return e.full_state(false);
}

}  // namespace

TEST_CASE("--optimizer muon in the engine equals Muon + AdamW on the whole model",
          "[mpi][shard][muon]") {
  auto world = testing::world_comm();
  optim::MuonOptions o;
  const double ratio = 10.0;
  testing::TrainSetup c;
  c.lr = 2e-3;
  // Every strategy at this world size, then hybrid_shard at each node count dividing it (Muon's
  // owners are counted inside a shard group; every replica orthogonalises its own copy of the
  // same matrices, identical after the replicate all-reduce), clipping on: each within `bound`
  // of `want`. The gradients differ from the reference's by their summation order only, and the
  // bf16 Newton-Schulz may round such a difference to the next bf16 value: one bf16 step (2^-8)
  // of an orthogonalised update of lr x ratio = 2e-2 moves a weight by ~8e-5, ~1e-3 of these
  // weights' scale per step. Measured: 7.5e-4 at every world size on an Intel Xeon (AVX-512, no
  // bf16 instructions), 5.4e-7 on an AMD EPYC, where no element happened to round the other way;
  // so with bf16 the bound is 4e-3 (3 steps of such flips), and the exactness check is the fp32
  // Newton-Schulz case below (the matrices alone are bitwise equal for equal gradients: the test
  // above).
  const int w = comm::topology().world_size;
  const auto every_layout = [&](const optim::MuonOptions& opts,
                                const std::map<std::string, torch::Tensor>& want, double bound,
                                const char* label) {
    for (auto s :
         {shard::Strategy::kFullShard, shard::Strategy::kShardGradOp, shard::Strategy::kNoShard}) {
      INFO(label << "strategy " << shard::strategy_name(s));
      const auto got = muon_engine_run(s, testing::groups_for(s, world), c, 3, opts, ratio);
      CHECK(testing::max_rel_diff(got, want) < bound);
    }
    for (int nodes = 1; nodes <= w; ++nodes) {
      if (w % nodes) continue;
      INFO(label << "hybrid_shard with " << nodes << " pretend nodes");
      const auto got = muon_engine_run(shard::Strategy::kHybridShard, testing::hybrid_groups(nodes),
                                       c, 3, opts, ratio);
      CHECK(testing::max_rel_diff(got, want) < bound);
    }
  };
  const auto ref = muon_reference(3, c, o, ratio);
  every_layout(o, ref, 4e-3, "");
  // With the Newton-Schulz in fp32 (tests only) nothing rounds the summation-order difference to
  // a bf16 step: every strategy and hybrid_shard equal the reference within 1e-5 of each
  // tensor's largest value (measured: 1.3e-6 at 4 ranks, 1.2e-6 at 3), the bound the AdamW-only
  // engine-equivalence tests hold (engine_equivalence.cpp: AdamW's division by sqrt(v) enlarges
  // last-bit differences of near-zero gradients, and the AdamW parameters are part of this run).
  optim::MuonOptions o32 = o;
  o32.ns_fp32 = true;
  every_layout(o32, muon_reference(3, c, o32, ratio), 1e-5, "fp32 Newton-Schulz, ");
  // The Muon group really moved differently from AdamW: a run with AdamW alone is far, beyond
  // the bf16 bound.
  const auto adamw = testing::train_reference(7, 0, 3, c);
  CHECK(testing::max_rel_diff(adamw, ref) > 10 * 4e-3);
}
