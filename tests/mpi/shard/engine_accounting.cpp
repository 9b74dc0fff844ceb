// Communication volume per step equals the theoretical count for each strategy (from the
// communicators' statistics), FULL_SHARD persistent memory is 1/N of the unsharded state plus
// padding, and non-finite gradients skip the step without touching weights or moments.
#include <catch2/catch.hpp>

#include <cmath>

#include "mpi/shard/groups.h"
#include "mpi/shard/tiny_model.h"
#include "shard/flat_param.h"

using namespace fsdp;
using namespace fsdp::testing;
using comm::OpType;
using shard::Strategy;

namespace {

// Forward uses per step and whether the unit's output needs backward, for TinyModel.
int forward_uses(const std::string& unit) {
  return unit == "block" ? 2 : 1;
}
bool needs_backward(const std::string& unit) {
  return unit != "embed";
}

struct Volume {
  uint64_t ag_bytes = 0, ag_calls = 0, rs_bytes = 0, rs_calls = 0, ar_bytes = 0, ar_calls = 0;
};

Volume measure(shard::ShardEngine& e, TinyModel& m, const TrainSetup& c) {
  for (auto* cm : {e.groups().shard.get(), e.groups().replicate.get()})
    if (cm) cm->stats().reset();
  const auto& t = comm::topology();
  train_engine(m, e, t.world_rank, t.world_size, 0, 1, c);
  Volume v;
  auto add = [&](comm::Communicator* cm) {
    if (!cm) return;
    v.ag_bytes += cm->stats().get(OpType::kAllGather).bytes;
    v.ag_calls += cm->stats().get(OpType::kAllGather).calls;
    v.rs_bytes += cm->stats().get(OpType::kReduceScatter).bytes;
    v.rs_calls += cm->stats().get(OpType::kReduceScatter).calls;
    v.ar_bytes += cm->stats().get(OpType::kAllReduce).bytes;
    v.ar_calls += cm->stats().get(OpType::kAllReduce).calls;
  };
  add(e.groups().shard.get());
  add(e.groups().replicate.get());
  return v;
}

}  // namespace

TEST_CASE("communication volume per step matches theory", "[mpi][shard]") {
  const int w = comm::topology().world_size;
  auto world = world_comm();
  for (Strategy s : {Strategy::kFullShard, Strategy::kShardGradOp, Strategy::kNoShard}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool local_acc = variant == 1, between_uses = variant == 2;
      INFO(shard::strategy_name(s)
           << " local accumulation " << local_acc << " reshard between uses " << between_uses);
      TrainSetup c;
      c.local_accumulation = local_acc;
      const uint64_t A = c.micro_batches, syncs = local_acc ? 1 : A;
      TinyModel m(7);
      shard::EngineOptions eo = engine_options(s, c);
      eo.reshard_between_uses = between_uses;
      shard::ShardEngine e(*m, groups_for(s, world), eo);
      m->set_unit_hooks(&e);
      const Volume v = measure(e, m, c);
      Volume want;
      if (w > 1 && s != Strategy::kNoShard) {
        for (const auto* l : e.layouts()) {
          // ZeRO-3: one gather per forward use, plus one re-gather before backward; by default
          // a unit that runs twice stays gathered between its uses once the engine has seen
          // one forward (the first micro-batch of the engine's life gathers at every use).
          // ZeRO-2: one gather per micro-batch (kept until the end of backward).
          const uint64_t bwd = needs_backward(l->unit) ? 1 : 0;
          const uint64_t gathers = s != Strategy::kFullShard ? A
                                   : between_uses
                                       ? A * (forward_uses(l->unit) + bwd)
                                       : forward_uses(l->unit) + bwd + (A - 1) * (1 + bwd);
          want.ag_calls += gathers;
          want.ag_bytes += gathers * l->padded_numel * 4;
          if (l->trainable) {
            want.rs_calls += syncs;
            want.rs_bytes += syncs * l->padded_numel * 4;
          }
        }
        want.ar_calls = 1;  // global grad norm
        want.ar_bytes = 8;
      }
      if (w > 1 && s == Strategy::kNoShard) {
        for (const auto* l : e.layouts()) {
          if (!l->trainable) continue;
          want.ar_calls += syncs;
          want.ar_bytes += syncs * l->numel * 4;
        }
      }
      CHECK(v.ag_calls == want.ag_calls);
      CHECK(v.ag_bytes == want.ag_bytes);
      CHECK(v.rs_calls == want.rs_calls);
      CHECK(v.rs_bytes == want.rs_bytes);
      CHECK(v.ar_calls == want.ar_calls);
      CHECK(v.ar_bytes == want.ar_bytes);
    }
  }
  if (w % 2 == 0 && w > 2) {
    // HYBRID with 2 pretend nodes: FULL_SHARD traffic inside a node plus an all-reduce of each
    // gradient shard across nodes.
    TrainSetup c;
    TinyModel m(7);
    shard::EngineOptions eo = engine_options(Strategy::kHybridShard, c);
    eo.reshard_between_uses = true;  // every use gathers: the count below
    shard::ShardEngine e(*m, hybrid_groups(2), eo);
    m->set_unit_hooks(&e);
    const Volume v = measure(e, m, c);
    uint64_t ag = 0, rs = 0, ar = 8;
    for (const auto* l : e.layouts()) {
      ag += c.micro_batches * (forward_uses(l->unit) + (needs_backward(l->unit) ? 1 : 0)) *
            l->padded_numel * 4;
      if (l->trainable) {
        rs += c.micro_batches * l->padded_numel * 4;
        ar += c.micro_batches * l->shard_numel * 4;
      }
    }
    CHECK(v.ag_bytes == ag);
    CHECK(v.rs_bytes == rs);
    CHECK(v.ar_bytes == ar);
  }
}

TEST_CASE("FULL_SHARD persistent memory is 1/N of the unsharded state plus padding",
          "[mpi][shard]") {
  const int w = comm::topology().world_size;
  TrainSetup c;
  TinyModel m(7);
  shard::ShardEngine e(*m, groups_for(Strategy::kFullShard, world_comm()),
                       engine_options(Strategy::kFullShard, c));
  m->set_unit_hooks(&e);
  // Unsharded: fp32 master + grad + 2 moments per trainable element, one fp32 copy per frozen.
  int64_t unsharded = 0, padding = 0;
  for (const auto* l : e.layouts()) {
    const int64_t per = l->trainable ? 16 : 4;
    unsharded += l->numel * per;
    padding += (l->padded_numel - l->numel) * per;
  }
  const auto mem = e.memory();
  int64_t expected = (unsharded + padding) / w;
  if (w == 1) {
    for (const auto* l : e.layouts()) expected += l->padded_numel * 4;  // resident full buffer
  }
  CHECK(mem.persistent_device_bytes == expected);
  CHECK(mem.persistent_host_bytes == 0);
  // Nothing gathered outside a forward/backward; peaks are positive after a step.
  train_engine(m, e, comm::topology().world_rank, w, 0, 1, c);
  const auto after = e.memory();
  if (w > 1) CHECK(after.gathered_param_bytes == 0);
  CHECK(after.grad_buffer_bytes == 0);
  CHECK(after.peak_grad_buffer_bytes > 0);
  if (w > 1) {
    int64_t total_gathered = 0;
    for (const auto* l : e.layouts()) total_gathered += l->padded_numel * 4;
    CHECK(after.peak_gathered_param_bytes > 0);
    CHECK(after.peak_gathered_param_bytes < total_gathered);  // never all units at once
  }
}

TEST_CASE("non-finite gradients skip the step and leave the state unchanged", "[mpi][shard]") {
  TrainSetup c;
  TinyModel m(7);
  auto world = world_comm();
  shard::ShardEngine e(*m, groups_for(Strategy::kFullShard, world),
                       engine_options(Strategy::kFullShard, c));
  m->set_unit_hooks(&e);
  const auto& t = comm::topology();
  train_engine(m, e, t.world_rank, t.world_size, 0, 1, c);
  const auto before = e.full_state(false);
  std::vector<torch::Tensor> moments;
  for (auto* f : e.flat_params())
    if (f->trainable()) moments.push_back(f->exp_avg().clone());
  // Only the last rank produces an infinite loss: every rank must still skip.
  const double scale = t.world_rank == t.world_size - 1 ? INFINITY : 1.0;
  auto r = train_engine(m, e, t.world_rank, t.world_size, 1, 1, c, scale);
  REQUIRE(r.size() == 1);
  CHECK(r[0].skipped);
  CHECK_FALSE(std::isfinite(r[0].grad_norm));
  CHECK(e.step_count() == 1);
  const auto after = e.full_state(false);
  for (const auto& [name, w] : before) CHECK(torch::equal(w, after.at(name)));
  size_t i = 0;
  for (auto* f : e.flat_params())
    if (f->trainable()) CHECK(torch::equal(f->exp_avg(), moments[i++]));
  // Training continues normally afterwards.
  auto ok = train_engine(m, e, t.world_rank, t.world_size, 1, 1, c);
  CHECK_FALSE(ok[0].skipped);
  CHECK(e.step_count() == 2);
}

TEST_CASE("device step scalars: same bits as host scalars, skip included, no host read",
          "[mpi][shard]") {
  // Device scalars run the fused AdamW kernel with the norm, clip coefficient, skip flag and
  // step count in (here: CPU) tensors; host scalars with the fused kernel must give the same
  // weights, moments and step counts, through clipping and a non-finite step.
  TrainSetup c;
  const auto& t = comm::topology();
  auto world = world_comm();
  using S = shard::EngineOptions::StepScalars;
  std::map<std::string, torch::Tensor> state[2];
  std::vector<torch::Tensor> moments[2];
  std::vector<shard::StepResult> results[2];
  for (int k = 0; k < 2; ++k) {
    INFO((k == 0 ? "host" : "device") << " scalars");
    TinyModel m(7);
    auto o = engine_options(Strategy::kFullShard, c);
    o.adamw_impl = optim::AdamWImpl::kFused;
    o.step_scalars = k == 0 ? S::kHost : S::kDevice;
    shard::ShardEngine e(*m, groups_for(Strategy::kFullShard, world), o);
    m->set_unit_hooks(&e);
    const double bad = t.world_rank == t.world_size - 1 ? INFINITY : 1.0;
    for (auto [first, scale] : {std::pair<int64_t, double>{0, 1.0}, {1, 1.0}, {2, bad}, {2, 1.0}}) {
      auto r = train_engine(m, e, t.world_rank, t.world_size, first, 1, c, scale);
      CHECK(r[0].resolved == (k == 0));
      r[0].resolve();
      results[k].push_back(r[0]);
    }
    CHECK(e.step_count() == 3);
    state[k] = e.full_state(false);
    for (auto* f : e.flat_params())
      if (f->trainable()) moments[k].push_back(f->exp_avg_sq().clone());
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    INFO("step " << i);
    const auto &h = results[0][i], &d = results[1][i];
    CHECK(h.skipped == d.skipped);
    CHECK(h.step == d.step);
    // On the CPU the host path sums squares with its own loop (on a GPU both paths run the
    // same device reduction): the norms agree to rounding, the fp32 weights bit for bit.
    CHECK(h.clip_coef == Approx(d.clip_coef).epsilon(1e-12));
    if (std::isfinite(h.grad_norm)) CHECK(h.grad_norm == Approx(d.grad_norm).epsilon(1e-12));
    CHECK(std::isfinite(h.grad_norm) == std::isfinite(d.grad_norm));
  }
  CHECK(results[1][2].skipped);
  CHECK(results[1][1].clip_coef < 1.0);  // clipping was active
  for (const auto& [name, w] : state[0]) {
    INFO(name);
    CHECK(torch::equal(w, state[1].at(name)));
  }
  for (size_t i = 0; i < moments[0].size(); ++i) CHECK(torch::equal(moments[0][i], moments[1][i]));
}
