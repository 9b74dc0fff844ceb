// Configuration to component options: every value of every mirrored enum maps to its
// counterpart (checked by name where the library has names), and each option struct carries the
// configuration's values.
#include <catch2/catch.hpp>

#include <string>

#include "train/component_options.h"

using namespace fsdp;
using namespace fsdp::train;

TEST_CASE("every sharding strategy maps to the engine's of the same name", "[train]") {
  using S = config::ShardingStrategy;
  for (S s : {S::kFullShard, S::kShardGradOp, S::kNoShard, S::kHybridShard}) {
    INFO(config::to_string(s));
    CHECK(std::string(shard::strategy_name(to_engine(s))) == config::to_string(s));
    CHECK(shard::parse_strategy(config::to_string(s)) == to_engine(s));
  }
}

TEST_CASE("every enum value maps", "[train]") {
  using P = config::Precision;
  CHECK(to_dtype(P::kBF16) == c10::kBFloat16);
  CHECK(to_dtype(P::kFP32) == c10::kFloat);
  using SS = config::StepScalars;
  using ES = shard::EngineOptions::StepScalars;
  CHECK(to_engine(SS::kAuto) == ES::kAuto);
  CHECK(to_engine(SS::kHost) == ES::kHost);
  CHECK(to_engine(SS::kDevice) == ES::kDevice);
  using LN = config::LossNormalization;
  CHECK(to_loss(LN::kBatch) == model::LossNormalization::kBatchTokens);
  CHECK(to_loss(LN::kTokens) == model::LossNormalization::kValidTokens);
  using L = config::LrScheduler;
  CHECK(to_decay(L::kCosine) == optim::LrDecay::kCosine);
  CHECK(to_decay(L::kLinear) == optim::LrDecay::kLinear);
  CHECK(to_decay(L::kConstant) == optim::LrDecay::kConstant);
  // A value outside the enum is a bug report, not a silent default.
  CHECK_THROWS_AS(to_decay(static_cast<L>(99)), fsdp::Error);
  CHECK_THROWS_AS(to_engine(static_cast<config::ShardingStrategy>(99)), fsdp::Error);
}

TEST_CASE("engine options carry the configuration", "[train]") {
  config::TrainConfig cfg;
  cfg.shard.strategy = config::ShardingStrategy::kShardGradOp;
  cfg.shard.mixed_precision = config::Precision::kFP32;
  cfg.shard.reduce_dtype = config::Precision::kBF16;
  cfg.shard.cpu_offload = true;
  cfg.shard.reshard_between_uses = true;
  cfg.runtime.step_scalars = config::StepScalars::kDevice;
  cfg.optim.adam_beta1 = 0.8;
  cfg.optim.adam_beta2 = 0.9;
  cfg.optim.adam_eps = 1e-6;
  cfg.optim.weight_decay = 0.1;
  const auto eo = engine_options(cfg, c10::Device(c10::kCPU));
  CHECK(eo.strategy == shard::Strategy::kShardGradOp);
  CHECK(eo.mixed_precision.param_dtype == c10::kFloat);
  CHECK(eo.mixed_precision.reduce_dtype == c10::kBFloat16);
  CHECK(eo.cpu_offload);
  CHECK(eo.reshard_between_uses);
  CHECK(eo.step_scalars == shard::EngineOptions::StepScalars::kDevice);
  CHECK(eo.adamw.beta1 == 0.8);
  CHECK(eo.adamw.beta2 == 0.9);
  CHECK(eo.adamw.eps == 1e-6);
  CHECK(eo.adamw.weight_decay == 0.1);
  CHECK(eo.device.is_cpu());
}

TEST_CASE("loader options: readers per device", "[train]") {
  config::TrainConfig cfg;
  cfg.data.max_length = 77;
  cfg.data.skip_bad_samples = true;
  auto lo = loader_options(cfg, c10::Device(c10::kCPU));
  CHECK(lo.max_length == 77);
  CHECK(lo.skip_bad_samples);
  CHECK(!lo.pin_memory);
  CHECK(lo.prefetch_threads == 1);
  lo = loader_options(cfg, c10::Device(c10::kCUDA, 0));  // only the option: no GPU touched
  CHECK(lo.pin_memory);
  CHECK(lo.prefetch_threads == 4);
  cfg.data.loader_threads = 3;
  CHECK(loader_options(cfg, c10::Device(c10::kCPU)).prefetch_threads == 3);
}

TEST_CASE("noise options: the training loader's only, never the evaluation loader's", "[train]") {
  config::TrainConfig cfg;
  CHECK_FALSE(noise_options(cfg).enabled());  // off by default
  cfg.data.noise_std = 0.05;
  cfg.data.noise_type = config::NoiseType::kGaussian;
  cfg.loop.seed = 7;
  const data::NoiseOptions n = noise_options(cfg);
  CHECK(n.enabled());
  CHECK(n.std == 0.05);
  CHECK(n.type == data::NoiseType::kGaussian);
  CHECK(n.seed == 7);
  // loader_options is what evaluation loaders use as it is: noise stays off there.
  CHECK_FALSE(loader_options(cfg, c10::Device(c10::kCPU)).noise.enabled());
  CHECK(to_noise(config::NoiseType::kUniform) == data::NoiseType::kUniform);
  CHECK(to_noise(config::NoiseType::kGaussian) == data::NoiseType::kGaussian);
  CHECK_THROWS_AS(to_noise(static_cast<config::NoiseType>(99)), fsdp::Error);
}

TEST_CASE("loss options", "[train]") {
  config::TrainConfig cfg;
  cfg.model.ttt_length = 5;
  cfg.model.activation_checkpointing = true;
  cfg.loop.loss_normalization = config::LossNormalization::kTokens;
  const auto lo = loss_options(cfg, 4);
  CHECK(lo.ttt_length == 5);
  CHECK(lo.accumulation_steps == 4);
  CHECK(lo.recompute_loss);
  CHECK(lo.normalization == model::LossNormalization::kValidTokens);
  CHECK(loss_options(cfg, 1).accumulation_steps == 1);
  CHECK(lo.head_chunk_rows == 0);  // automatic by default
  cfg.model.head_chunk_rows = 512;
  CHECK(loss_options(cfg, 1).head_chunk_rows == 512);
  CHECK(memory_plan(cfg, c10::Device(c10::kCPU), 1, 1, 1).head_chunk_rows == 512);
}

TEST_CASE("profiler directory: flag, then environment, then output dir", "[train]") {
  config::TrainConfig cfg;
  cfg.checkpoint.output_dir = "/out";
  cfg.profile.start_step = 3;
  cfg.profile.num_steps = 2;
  cfg.profile.record_shapes = true;
  auto o = profiler_options(cfg, c10::Device(c10::kCPU), 1, "");
  CHECK(o.dir == "/out/profile");
  CHECK(o.start_step == 3);
  CHECK(o.num_steps == 2);
  CHECK(o.record_shapes);
  CHECK(o.rank == 1);
  CHECK(!o.gpu);
  CHECK(profiler_options(cfg, c10::Device(c10::kCPU), 0, "/env").dir == "/env");
  cfg.profile.dir = "/flag";
  CHECK(profiler_options(cfg, c10::Device(c10::kCPU), 0, "/env").dir == "/flag");
}

TEST_CASE("sink context of a fresh, resumed and restarted run", "[train]") {
  config::TrainConfig cfg;
  cfg.checkpoint.output_dir = "/out";
  RunState st;
  auto sc = sink_context(cfg, 0, 100, "{}", st, false);
  CHECK(sc.total_steps == 100);
  CHECK(sc.output_dir == "/out");
  CHECK(sc.config_json == "{}");
  CHECK(sc.resumed_step == 0);
  CHECK(sc.tensorboard_resumed_step == -1);  // a fresh start keeps a shared TensorBoard dir
  CHECK(sink_context(cfg, 0, 100, "{}", st, true).tensorboard_resumed_step == 0);
  st.step = 12;
  st.wandb_run_id = "abc";
  sc = sink_context(cfg, 1, 100, "{}", st, false);
  CHECK(sc.rank == 1);
  CHECK(sc.resumed_step == 12);
  CHECK(sc.tensorboard_resumed_step == 12);
  CHECK(sc.wandb_run_id == "abc");
}

TEST_CASE("warmup: steps, else ratio", "[train]") {
  config::TrainConfig cfg;
  cfg.optim.warmup_ratio = 0.1;
  CHECK(warmup_steps(cfg, 55) == 5);
  cfg.optim.warmup_steps = 9;
  CHECK(warmup_steps(cfg, 55) == 9);
}

TEST_CASE("the memory plan follows the sharding strategy, precision and device", "[train]") {
  using S = config::ShardingStrategy;
  config::TrainConfig cfg;
  cfg.data.max_length = 4096;
  cfg.model.ttt_length = 5;
  cfg.model.activation_checkpointing = true;
  const c10::Device cpu(c10::kCPU), gpu(c10::kCUDA, 0);
  struct Row {
    S strategy;
    int64_t shard_ranks;
    bool whole;
  };
  // 8 ranks in all, 4 on this node.
  for (const Row& r : {Row{S::kFullShard, 8, false}, Row{S::kShardGradOp, 8, true},
                       Row{S::kNoShard, 1, true}, Row{S::kHybridShard, 4, false}}) {
    INFO(config::to_string(r.strategy));
    cfg.shard.strategy = r.strategy;
    const model::MemoryPlan m = memory_plan(cfg, gpu, 3, 8, 4);
    CHECK(m.shard_ranks == r.shard_ranks);
    CHECK(m.whole_compute_copy == r.whole);
    CHECK(m.max_length == 4096);
    CHECK(m.micro_batch == 3);
    CHECK(m.ttt_length == 5);
    CHECK(m.activation_checkpointing);
    CHECK(m.ranks_sharing_memory == 1);  // a GPU per rank
  }
  cfg.shard.mixed_precision = config::Precision::kBF16;
  CHECK(memory_plan(cfg, cpu, 1, 8, 4).compute_bytes == 2);
  cfg.shard.mixed_precision = config::Precision::kFP32;
  CHECK(memory_plan(cfg, cpu, 1, 8, 4).compute_bytes == 4);
  // The CPU ranks of one node share its memory; offload only moves state off a GPU.
  cfg.shard.cpu_offload = true;
  CHECK(memory_plan(cfg, cpu, 1, 8, 4).ranks_sharing_memory == 4);
  CHECK_FALSE(memory_plan(cfg, cpu, 1, 8, 4).state_on_host);
  CHECK(memory_plan(cfg, gpu, 1, 8, 4).state_on_host);
}
