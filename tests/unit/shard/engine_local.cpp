// The engine in one process (groups of one, no MPI): equivalence with plain LibTorch, repeated
// unit uses, unit-plan errors, memory accounting of NO_SHARD, and the shard-file round trip,
// also when the disk refuses the write.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/fs_util.h"
#include "mpi/shard/tiny_model.h"
#include "shard/flat_param.h"
#include "support/file_size_limit.h"
#include "support/test_paths.h"

using namespace fsdp;
using namespace fsdp::testing;
using shard::Strategy;

TEST_CASE("single-process engine equals plain LibTorch", "[shard]") {
  TrainSetup c;
  const auto ref = train_reference(7, 0, 3, c);
  for (Strategy s : {Strategy::kFullShard, Strategy::kShardGradOp, Strategy::kNoShard}) {
    for (bool local : {false, true}) {
      INFO(shard::strategy_name(s) << " local accumulation " << local);
      TrainSetup cs = c;
      cs.local_accumulation = local;
      TinyModel m(7);
      shard::ShardEngine e(*m, {}, engine_options(s, cs));
      m->set_unit_hooks(&e);
      auto r = train_engine(m, e, 0, 1, 0, 3, cs);
      CHECK(r.back().step == 3);
      CHECK(max_rel_diff(e.full_state(false), ref) < 1e-5);
    }
  }
}

TEST_CASE("default plan is one unit per child; parameters are views of flat buffers", "[shard]") {
  TinyModel m(7);
  shard::ShardEngine e(*m, {}, engine_options(Strategy::kFullShard, TrainSetup{}));
  REQUIRE(e.unit_names() == std::vector<std::string>{"embed", "mlp", "block", "head"});
  // head has a trainable and a frozen flat buffer; embed only a frozen one.
  REQUIRE(e.layouts().size() == 5);
  int frozen = 0;
  for (const auto* l : e.layouts()) frozen += l->trainable ? 0 : 1;
  REQUIRE(frozen == 2);
  // full_state without the frozen buffers: exactly the trainable parameters, same values.
  const auto all = e.full_state(false), trainable = e.full_state(false, /*include_frozen=*/false);
  size_t n_trainable = 0;
  for (const auto* l : e.layouts()) n_trainable += l->trainable ? l->params.size() : 0;
  CHECK(trainable.size() == n_trainable);
  CHECK(trainable.size() < all.size());
  for (const auto& [name, t] : trainable) CHECK(torch::equal(t, all.at(name)));
  for (const auto* l : e.layouts()) {
    for (const auto& p : l->params) CHECK(trainable.count(p.name) == (l->trainable ? 1u : 0u));
  }
  // 1-D parameters are excluded from weight decay.
  for (const auto* l : e.layouts())
    for (const auto& p : l->params) CHECK(p.decay == (p.shape.size() >= 2));
  auto* f = e.flat_params()[1];  // mlp
  f->wait_gather();
  const auto& params = f->params();
  REQUIRE(params.size() == 4);
  const char* base = static_cast<const char*>(params[0].data_ptr());
  CHECK(static_cast<const char*>(params[1].data_ptr()) == base + params[0].numel() * 4);
}

TEST_CASE("unit plan errors name the problem", "[shard]") {
  auto opts = engine_options(Strategy::kFullShard, TrainSetup{});
  {
    TinyModel m(7);
    opts.units = {"embed", "mlp", "blok", "head"};
    CHECK_THROWS_WITH(shard::ShardEngine(*m, {}, opts), Catch::Contains("blok"));
  }
  {
    TinyModel m(7);
    opts.units = {"embed", "mlp", "head"};
    CHECK_THROWS_AS(shard::ShardEngine(*m, {}, opts), UsageError);
  }
  {
    TinyModel m(7);
    opts.units = {"embed", "mlp", "block", "block.q_proj", "head"};
    CHECK_THROWS_WITH(shard::ShardEngine(*m, {}, opts), Catch::Contains("block.q_proj.weight"));
  }
  CHECK_THROWS_AS(shard::parse_strategy("zero4"), UsageError);
  CHECK(shard::parse_strategy("FULL_SHARD") == Strategy::kFullShard);
  shard::EngineOptions bad;
  bad.mixed_precision.param_dtype = torch::kHalf;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("parameter dtype"));
}

TEST_CASE("a unit run several times per forward gets its gradients once", "[shard]") {
  // Three uses of block (like the EAGLE3 midlayer in the TTT unroll) against plain LibTorch.
  TrainSetup c;
  c.micro_batches = 1;
  TinyModel ref(7, 3), m(7, 3);
  shard::ShardEngine e(*m, {}, engine_options(Strategy::kFullShard, c));
  m->set_unit_hooks(&e);
  Batch b = global_batch(0);
  auto loss_ref = torch::nn::functional::cross_entropy(ref->forward(b.ids).reshape({-1, kVocab}),
                                                       b.targets.reshape({-1}));
  loss_ref.backward();
  auto loss = torch::nn::functional::cross_entropy(m->forward(b.ids).reshape({-1, kVocab}),
                                                   b.targets.reshape({-1}));
  loss.backward();
  CHECK(loss.item<double>() == Approx(loss_ref.item<double>()).epsilon(1e-6));
  // The gradient shard of block equals the reference gradients flattened in layout order.
  for (auto* f : e.flat_params()) {
    if (f->layout().unit != "block") continue;
    std::vector<torch::Tensor> flat;
    for (const auto& p : f->layout().params) {
      flat.push_back(ref->named_parameters()[p.name].grad().reshape({-1}));
    }
    auto want = torch::cat(flat);
    CHECK(torch::allclose(f->grad_shard().narrow(0, 0, want.numel()), want, 1e-5, 1e-7));
  }
}

TEST_CASE("scale_gradients divides a summed loss's gradients after the last backward", "[shard]") {
  // A loss three times too large, scaled by 1/3 after backward (how a step normalises a summed
  // loss by its global normaliser), gives the plain loss's gradient shards; scaling by 0.
  // Tolerance: float32 rounding of the x3 and /3 (measured worst 3.4e-8 absolute).
  TrainSetup c;
  c.micro_batches = 1;
  TinyModel plain(7), summed(7);
  shard::ShardEngine ep(*plain, {}, engine_options(Strategy::kFullShard, c));
  shard::ShardEngine es(*summed, {}, engine_options(Strategy::kFullShard, c));
  plain->set_unit_hooks(&ep);
  summed->set_unit_hooks(&es);
  Batch b = global_batch(0);
  const auto loss = [&b](TinyModel& m) {
    return torch::nn::functional::cross_entropy(m->forward(b.ids).reshape({-1, kVocab}),
                                                b.targets.reshape({-1}));
  };
  loss(plain).backward();
  (loss(summed) * 3.0).backward();
  ep.finish_backward();
  es.scale_gradients(1.0 / 3.0);
  const auto fp = ep.flat_params(), fs = es.flat_params();
  REQUIRE(fp.size() == fs.size());
  int compared = 0;
  for (size_t i = 0; i < fp.size(); ++i) {
    if (!fp[i]->grad_shard().defined()) continue;
    INFO("flat " << i << ": max |summed/3 - plain| "
                 << (fs[i]->grad_shard() - fp[i]->grad_shard()).abs().max().item<double>()
                 << ", max |plain| " << fp[i]->grad_shard().abs().max().item<double>());
    CHECK(torch::allclose(fs[i]->grad_shard(), fp[i]->grad_shard(), 1e-5, 1e-7));
    ++compared;
  }
  CHECK(compared >= 3);
  es.scale_gradients(0.0);
  for (auto* f : es.flat_params()) {
    if (f->grad_shard().defined()) CHECK(f->grad_shard().abs().max().item<double>() == 0.0);
  }
}

TEST_CASE("one rank in bf16: the gradient shard is the bf16 gradient, widened exactly", "[shard]") {
  // No reduction to make: the unit's bf16 gradient goes into the fp32 shard by one widening add
  // (no fp32 copy in between); bit for bit what plain LibTorch's bf16 gradients widen to.
  TrainSetup c;
  c.micro_batches = 1;
  TinyModel ref(7, 3), m(7, 3);
  ref->to(torch::kBFloat16);
  shard::ShardEngine e(*m, {}, engine_options(Strategy::kFullShard, c, torch::kBFloat16));
  m->set_unit_hooks(&e);
  Batch b = global_batch(0);
  torch::nn::functional::cross_entropy(ref->forward(b.ids).reshape({-1, kVocab}).to(torch::kFloat),
                                       b.targets.reshape({-1}))
      .backward();
  torch::nn::functional::cross_entropy(m->forward(b.ids).reshape({-1, kVocab}).to(torch::kFloat),
                                       b.targets.reshape({-1}))
      .backward();
  int64_t units = 0;
  for (auto* f : e.flat_params()) {
    if (!f->trainable()) continue;
    std::vector<torch::Tensor> flat;
    for (const auto& p : f->layout().params)
      flat.push_back(ref->named_parameters()[p.name].grad().reshape({-1}).to(torch::kFloat));
    const auto want = torch::cat(flat);
    INFO("unit " << f->layout().unit);
    CHECK(f->grad_shard().scalar_type() == torch::kFloat);
    CHECK(torch::equal(f->grad_shard().narrow(0, 0, want.numel()), want));
    ++units;
  }
  CHECK(units > 0);
}

TEST_CASE("offload memory accounting", "[shard]") {
  TrainSetup c;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    TinyModel m(7);
    auto o = engine_options(Strategy::kFullShard, c, dtype);
    o.cpu_offload = true;
    shard::ShardEngine e(*m, {}, o);
    int64_t trainable = 0, frozen = 0;
    for (const auto* l : e.layouts()) (l->trainable ? trainable : frozen) += l->padded_numel;
    const auto mem = e.memory();
    const int64_t es = dtype == torch::kFloat ? 4 : 2;
    CHECK(mem.persistent_host_bytes == trainable * 16);
    // Device: frozen shards and the resident full buffers of this group of one, plus the
    // compute-dtype copy of the trainable shard unless the fp32 host master can serve as it
    // (CPU device, fp32 compute).
    const int64_t copy = dtype == torch::kFloat ? 0 : trainable * es;
    CHECK(mem.persistent_device_bytes == copy + frozen * es + (trainable + frozen) * es);
  }
}

TEST_CASE("shard files round trip in one process", "[shard]") {
  TrainSetup c;
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test-tmp/shard_state_unit";
  testing::remove_tree(dir);
  TinyModel a(7);
  shard::ShardEngine ea(*a, {}, engine_options(Strategy::kFullShard, c));
  a->set_unit_hooks(&ea);
  train_engine(a, ea, 0, 1, 0, 2, c);
  shard::save_state(ea, dir);
  CHECK(path_exists(dir + "/manifest.txt"));
  CHECK(path_exists(dir + "/shard_0.pt"));
  train_engine(a, ea, 0, 1, 2, 1, c);
  TinyModel b(5);
  shard::ShardEngine eb(*b, {}, engine_options(Strategy::kFullShard, c));
  b->set_unit_hooks(&eb);
  shard::load_state(eb, dir);
  CHECK(eb.step_count() == 2);
  train_engine(b, eb, 0, 1, 2, 1, c);
  const auto wa = ea.full_state(false), wb = eb.full_state(false);
  for (const auto& [name, w] : wa) CHECK(torch::equal(w, wb.at(name)));
  CHECK_THROWS_WITH(shard::load_state(eb, dir + "/nope"), Catch::Contains("nope"));
}

TEST_CASE("a full disk during a state save is an error naming the file, not a crash", "[shard]") {
  TrainSetup c;
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test-tmp/shard_state_full";
  testing::remove_tree(dir);
  TinyModel a(7);
  shard::ShardEngine ea(*a, {}, engine_options(Strategy::kFullShard, c));
  a->set_unit_hooks(&ea);
  train_engine(a, ea, 0, 1, 0, 1, c);
  // The kernel refuses writes past 4 KiB: the shard file is larger, the manifest is not.
  std::string message, durable;
  with_file_size_limit(4096, [&] {
    try {
      shard::save_state(ea, dir);
    } catch (const Error& e) {
      message = e.message();
    }
    try {
      write_file_durably(dir + "/big.bin", std::string(8192, 'x'));
    } catch (const Error& e) {
      durable = e.message();
    }
  });
  CHECK(message.find("shard_0.pt.tmp") != std::string::npos);
  CHECK(message.find("failed") != std::string::npos);
  CHECK_FALSE(path_exists(dir + "/shard_0.pt"));  // never a short file under the final name
  CHECK(durable.find("big.bin: write failed (File too large)") != std::string::npos);
  // With room again the same engine saves and the state loads back.
  shard::save_state(ea, dir);
  TinyModel b(5);
  shard::ShardEngine eb(*b, {}, engine_options(Strategy::kFullShard, c));
  b->set_unit_hooks(&eb);
  shard::load_state(eb, dir);
  CHECK(eb.step_count() == 1);
}
