// A multi-layer draft under the sharding engine (docs/model.md "Draft variants"): every decoder
// layer (and fc's norms) is its own unit with its own flat buffer; the all-gather traffic of a
// training step equals each unit's uses as the model announced them (gather once per forward of
// a micro-batch, plus the re-gather before backward), so a layer used at every TTT step is not
// gathered T times, and prefetching changes nothing of that. The chunked head (lm_head's use
// inside the norm's, docs/model.md "Chunked head and loss") gathers the same and reaches the same
// weights. (1 vs 2 ranks reaching the same weights with a multi-layer draft:
// tests/e2e/draft_variants.sh.)
#include <algorithm>
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "model/draft_model.h"
#include "model/ttt_loss.h"
#include "mpi/shard/groups.h"
#include "shard/engine.h"
#include "shard/flat_param.h"
#include "support/small_draft.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

model::DraftConfig three_layers() {
  model::DraftConfig c = small_draft();
  c.max_position_embeddings = 32;
  c.target_hidden_size = 12;
  c.num_hidden_layers = 3;
  c.fc_norm = true;
  c.validate();
  return c;
}

// Forwards to the engine and counts each unit's forward uses.
struct Counting : UnitHooks {
  UnitHooks* inner = nullptr;
  std::map<std::string, int64_t> uses;
  void pre_forward(const std::string& unit) override {
    ++uses[unit];
    inner->pre_forward(unit);
  }
  void post_forward(const std::string& unit, const at::Tensor& out) override {
    inner->post_forward(unit, out);
  }
};

struct Batch {
  at::Tensor ids, mask, aux;
  model::TargetDistribution target;
};

Batch batch(const model::DraftConfig& c, int64_t seed) {
  torch::manual_seed(seed);
  Batch b;
  b.ids = torch::randint(0, c.vocab_size, {2, 8}, torch::kLong);
  b.mask = torch::ones({2, 8}, torch::kLong);
  b.mask[1].narrow(0, 6, 2).zero_();
  b.aux = torch::randn({2, 8, c.fc_in_features()});
  b.target.target_p = torch::rand({2, 8 + 3, c.draft_vocab()});
  b.target.target_p /= b.target.target_p.sum(-1, true);
  b.target.position_mask = b.mask.clone();
  return b;
}

// Two micro-batches of this rank and one optimizer step; returns the unit uses.
std::map<std::string, int64_t> step(model::Eagle3Draft& m, shard::ShardEngine& e, int rank,
                                    Counting& counting, int64_t head_chunk_rows) {
  model::LossOptions opt;
  opt.ttt_length = 3;
  opt.head_chunk_rows = head_chunk_rows;
  opt.accumulation_steps = 2;
  for (int a = 0; a < 2; ++a) {
    Batch b = batch(m->config(), 100 + 10 * a + rank);
    model::ttt_step(*m, b.target, b.ids, b.mask, b.mask, b.aux, opt).loss.backward();
  }
  e.step(1e-2, 1.0);
  return counting.uses;
}

}  // namespace

TEST_CASE("multi-layer draft: one unit per layer, gathers follow the uses, same weights",
          "[mpi][shard]") {
  const auto& t = comm::topology();
  const int w = t.world_size;
  auto world = world_comm();
  for (bool prefetch : {false, true}) {
    for (bool between_uses : {false, true}) {
      std::map<std::string, at::Tensor> unchunked;
      for (int64_t chunk : {int64_t{-1}, int64_t{3}}) {
        INFO("prefetch " << prefetch << " reshard between uses " << between_uses
                         << " head chunk rows " << chunk);
        torch::manual_seed(7);
        model::Eagle3Draft m(three_layers());
        shard::EngineOptions eo;
        eo.strategy = shard::Strategy::kFullShard;
        eo.units = m->unit_names();
        eo.prefetch = prefetch;
        eo.reshard_between_uses = between_uses;
        eo.adamw.weight_decay = 0.0;
        eo.mixed_precision.param_dtype = torch::kFloat;  // 4 bytes per gathered element
        shard::ShardEngine e(*m, {world, nullptr}, eo);
        std::vector<std::string> units;
        for (const auto* l : e.layouts())
          units.push_back(l->unit + (l->trainable ? "" : "/frozen"));
        CHECK(units == std::vector<std::string>{"embed_tokens/frozen", "fc_norm", "fc", "layers.0",
                                                "layers.1", "layers.2", "norm", "lm_head"});
        Counting counting;
        counting.inner = &e;
        m->set_unit_hooks(&counting);
        world->stats().reset();
        const auto uses = step(m, e, t.world_rank, counting, chunk);
        m->set_unit_hooks(nullptr);
        // Per micro-batch, each layer runs at every TTT step.
        for (const char* layer : {"layers.0", "layers.1", "layers.2"})
          CHECK(uses.at(layer) == 2 * 3);
        if (w > 1) {
          uint64_t bytes = 0;
          for (const auto* l : e.layouts()) {
            const int64_t per_mb = uses.at(l->unit) / 2;
            const int64_t bwd = l->trainable ? 1 : 0;  // the frozen embedding has no backward
            // The engine's first micro-batch gathers at every use; later ones keep a unit gathered
            // through its forward uses unless asked to reshard between them.
            const int64_t gathers = between_uses ? 2 * (per_mb + bwd) : per_mb + bwd + (1 + bwd);
            bytes += static_cast<uint64_t>(gathers * l->padded_numel * 4);
          }
          CHECK(world->stats().get(comm::OpType::kAllGather).bytes == bytes);
        }
        const auto weights = e.full_state(/*rank0_only=*/false, /*include_frozen=*/false);
        if (chunk < 0) {
          unchunked = weights;
          continue;
        }
        // Chunked matrix products round differently (their blocking depends on the row
        // count): the same weights within 1e-6 in relative L2 (an element whose gradient is
        // nearly 0 may take a slightly different AdamW step).
        for (const auto& [name, w] : weights) {
          INFO(name);
          const at::Tensor& u = unchunked.at(name);
          const double scale = std::max(u.norm().item<double>(), 1e-30);
          CHECK((w - u).norm().item<double>() / scale <= 1e-6);
        }
      }
    }
  }
}

TEST_CASE("the TTT steps' weight gradients summed inside their GEMMs equal autograd's sum",
          "[mpi][shard]") {
  // --fused-cuda-kernels' weight-gradient path (model/linear_grad.h) on the CPU in fp32: each
  // projection's uses but the one completing the count add dY^T X into the engine's flat
  // gradient in place; the gradient shards before the optimizer step and the weights after it
  // equal the plain path's, at every rank count, over two accumulated micro-batches.
  const auto& t = comm::topology();
  auto world = world_comm();
  std::map<std::string, at::Tensor> want_grads, want_weights;
  for (bool in_place : {false, true}) {
    INFO("in place " << in_place);
    torch::manual_seed(7);
    model::Eagle3Draft m(three_layers());
    m->set_weight_grad_in_place(in_place);
    shard::EngineOptions eo;
    eo.strategy = shard::Strategy::kFullShard;
    eo.units = m->unit_names();
    eo.adamw.weight_decay = 0.0;
    eo.mixed_precision.param_dtype = torch::kFloat;
    shard::ShardEngine e(*m, {world, nullptr}, eo);
    m->set_unit_hooks(&e);
    const int64_t before = model::linear_grad_in_place_adds();
    model::LossOptions opt;
    opt.ttt_length = 3;
    opt.accumulation_steps = 2;
    for (int a = 0; a < 2; ++a) {
      Batch b = batch(m->config(), 100 + 10 * a + t.world_rank);
      model::ttt_step(*m, b.target, b.ids, b.mask, b.mask, b.aux, opt).loss.backward();
    }
    // 3 layers x 7 projections x (3 uses - the last) x 2 micro-batches; none on the plain path.
    CHECK(model::linear_grad_in_place_adds() - before == (in_place ? 3 * 7 * 2 * 2 : 0));
    std::map<std::string, at::Tensor> grads;
    for (auto* f : e.flat_params())
      if (f->trainable()) grads[f->layout().unit] = f->grad_shard().clone();
    e.step(1e-2, 1.0);
    m->set_unit_hooks(nullptr);
    const auto weights = e.full_state(/*rank0_only=*/false, /*include_frozen=*/false);
    if (!in_place) {
      want_grads = grads;
      want_weights = weights;
      continue;
    }
    for (const auto& [unit, g] : grads) {
      INFO("gradient shard of " << unit);
      const at::Tensor& u = want_grads.at(unit);
      CHECK((g - u).norm().item<double>() <= 1e-6 * std::max(u.norm().item<double>(), 1e-30));
    }
    for (const auto& [name, w] : weights) {
      INFO(name);
      const at::Tensor& u = want_weights.at(name);
      CHECK((w - u).norm().item<double>() <= 1e-6 * std::max(u.norm().item<double>(), 1e-30));
    }
  }
}
