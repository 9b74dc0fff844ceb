// The engine on a CUDA device (groups of one, no MPI): same weights as on the CPU within fp32
// rounding, with and without CPU offload (pinned host state). Skipped without a GPU.
#include <catch2/catch.hpp>

#include "mpi/shard/tiny_model.h"
#include "support/gpu.h"

using namespace fsdp;
using namespace fsdp::testing;

TEST_CASE("engine on CUDA matches the CPU engine", "[cuda][shard]") {
  FSDP_REQUIRE_GPU();
  TrainSetup c;
  TinyModel cpu(7);
  shard::ShardEngine ec(*cpu, {}, engine_options(shard::Strategy::kFullShard, c));
  cpu->set_unit_hooks(&ec);
  train_engine(cpu, ec, 0, 1, 0, 2, c);
  const auto want = ec.full_state(false);
  for (bool offload : {false, true}) {
    INFO("offload " << offload);
    TinyModel m(7);
    m->to(torch::kCUDA);
    auto o = engine_options(shard::Strategy::kFullShard, c);
    o.device = c10::Device(c10::kCUDA, 0);
    o.cpu_offload = offload;
    shard::ShardEngine e(*m, {}, o);
    m->set_unit_hooks(&e);
    // Batches are made on the CPU; move the model's inputs through a CUDA wrapper.
    const int64_t mb = kGlobalBatch / c.micro_batches;
    for (int64_t s = 0; s < 2; ++s) {
      Batch b = global_batch(s);
      for (int a = 0; a < c.micro_batches; ++a) {
        auto logits = m->forward(b.ids.narrow(0, a * mb, mb).to(torch::kCUDA));
        auto loss = torch::nn::functional::cross_entropy(
            logits.reshape({-1, kVocab}),
            b.targets.narrow(0, a * mb, mb).reshape({-1}).to(torch::kCUDA));
        (loss * (static_cast<double>(mb) / kGlobalBatch)).backward();
      }
      // Device-resident state keeps the step's scalars on the GPU (nothing read on the host);
      // offloaded state steps on the host.
      auto r = e.step(c.lr, c.max_grad_norm);
      CHECK(r.resolved == offload);
      r.resolve();
      CHECK_FALSE(r.skipped);
      CHECK(r.step == s + 1);
    }
    CHECK(max_rel_diff(e.full_state(false), want) < 1e-4);
  }
}
