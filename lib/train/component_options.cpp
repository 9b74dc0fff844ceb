// Configuration to component options (see component_options.h). Every mapping is a switch
// without a default, so a new enum value is a compiler warning (an error with -Werror) here.
#include "train/component_options.h"

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"

namespace fsdp::train {

namespace {
[[noreturn]] void unknown(const char* what, int value) {
  FSDP_FAIL(str("unknown ", what, " value ", value), "a bug in fsdp-train: please report it");
  std::abort();  // not reached: the check throws
}
}  // namespace

shard::Strategy to_engine(config::ShardingStrategy s) {
  switch (s) {
    case config::ShardingStrategy::kFullShard:
      return shard::Strategy::kFullShard;
    case config::ShardingStrategy::kShardGradOp:
      return shard::Strategy::kShardGradOp;
    case config::ShardingStrategy::kNoShard:
      return shard::Strategy::kNoShard;
    case config::ShardingStrategy::kHybridShard:
      return shard::Strategy::kHybridShard;
  }
  unknown("sharding strategy", static_cast<int>(s));
}

shard::EngineOptions::StepScalars to_engine(config::StepScalars s) {
  switch (s) {
    case config::StepScalars::kAuto:
      return shard::EngineOptions::StepScalars::kAuto;
    case config::StepScalars::kHost:
      return shard::EngineOptions::StepScalars::kHost;
    case config::StepScalars::kDevice:
      return shard::EngineOptions::StepScalars::kDevice;
  }
  unknown("step scalars", static_cast<int>(s));
}

c10::ScalarType to_dtype(config::Precision p) {
  switch (p) {
    case config::Precision::kBF16:
      return c10::kBFloat16;
    case config::Precision::kFP32:
      return c10::kFloat;
  }
  unknown("precision", static_cast<int>(p));
}

model::LossNormalization to_loss(config::LossNormalization n) {
  switch (n) {
    case config::LossNormalization::kBatch:
      return model::LossNormalization::kBatchTokens;
    case config::LossNormalization::kTokens:
      return model::LossNormalization::kValidTokens;
  }
  unknown("loss normalization", static_cast<int>(n));
}

optim::LrDecay to_decay(config::LrScheduler s) {
  switch (s) {
    case config::LrScheduler::kCosine:
      return optim::LrDecay::kCosine;
    case config::LrScheduler::kLinear:
      return optim::LrDecay::kLinear;
    case config::LrScheduler::kConstant:
      return optim::LrDecay::kConstant;
  }
  unknown("learning-rate scheduler", static_cast<int>(s));
}

model::LossOptions::LK to_lk(config::LkLossType t) {
  switch (t) {
    case config::LkLossType::kNone:
      return model::LossOptions::LK::kNone;
    case config::LkLossType::kLambda:
      return model::LossOptions::LK::kLambda;
    case config::LkLossType::kAlpha:
      return model::LossOptions::LK::kAlpha;
  }
  unknown("LK loss type", static_cast<int>(t));
}

data::NoiseType to_noise(config::NoiseType t) {
  switch (t) {
    case config::NoiseType::kUniform:
      return data::NoiseType::kUniform;
    case config::NoiseType::kGaussian:
      return data::NoiseType::kGaussian;
  }
  unknown("noise type", static_cast<int>(t));
}

shard::EngineOptions engine_options(const config::TrainConfig& cfg, c10::Device device) {
  shard::EngineOptions eo;
  eo.strategy = to_engine(cfg.shard.strategy);
  eo.mixed_precision.param_dtype = to_dtype(cfg.shard.mixed_precision);
  eo.mixed_precision.reduce_dtype = to_dtype(cfg.shard.reduce_dtype);
  eo.device = device;
  eo.cpu_offload = cfg.shard.cpu_offload;
  eo.reshard_between_uses = cfg.shard.reshard_between_uses;
  eo.step_scalars = to_engine(cfg.runtime.step_scalars);
  eo.adamw.beta1 = cfg.optim.adam_beta1;
  eo.adamw.beta2 = cfg.optim.adam_beta2;
  eo.adamw.eps = cfg.optim.adam_eps;
  eo.adamw.weight_decay = cfg.optim.weight_decay;
  eo.muon = cfg.optim.optimizer == config::OptimizerKind::kMuon;
  FSDP_USAGE_CHECK(!cfg.optim.muon_lr || !cfg.given_options.count("muon-lr-ratio"),
                   "--muon-lr and --muon-lr-ratio both given: --muon-lr replaces the ratio",
                   "give one of them");
  eo.muon_lr_ratio =
      cfg.optim.muon_lr ? *cfg.optim.muon_lr / cfg.optim.learning_rate : cfg.optim.muon_lr_ratio;
  eo.muon_options.momentum = cfg.optim.muon_momentum;
  eo.muon_options.nesterov = cfg.optim.muon_nesterov;
  eo.muon_options.weight_decay = cfg.optim.muon_weight_decay;
  eo.muon_options.ns_steps = cfg.optim.muon_ns_steps;
  eo.muon_options.adjust_lr = cfg.optim.muon_adjust_lr == config::MuonAdjustLr::kOriginal
                                  ? optim::MuonAdjustLr::kOriginal
                                  : optim::MuonAdjustLr::kMatchRmsAdamW;
  return eo;
}

data::LoaderOptions loader_options(const config::TrainConfig& cfg, c10::Device device) {
  data::LoaderOptions lo;
  lo.max_length = cfg.data.max_length;
  lo.skip_bad_samples = cfg.data.skip_bad_samples;
  lo.pin_memory = !device.is_cpu();
  // Four readers on a GPU, like SpecForge's DataLoader workers: a 2k-token sample of an 8B
  // target is 64 MiB to read and unpickle per micro-batch.
  lo.prefetch_threads = static_cast<int>(cfg.data.loader_threads > 0 ? cfg.data.loader_threads
                                                                     : (device.is_cpu() ? 1 : 4));
  return lo;
}

data::NoiseOptions noise_options(const config::TrainConfig& cfg) {
  data::NoiseOptions o;
  o.std = cfg.data.noise_std;
  o.type = to_noise(cfg.data.noise_type);
  o.seed = static_cast<uint64_t>(cfg.loop.seed);
  return o;
}

model::LossOptions loss_options(const config::TrainConfig& cfg, int64_t accumulation,
                                model::SeqGroup* seq_group) {
  model::LossOptions lo;
  lo.seq_group = seq_group;
  lo.ttt_length = cfg.model.ttt_length;
  lo.accumulation_steps = accumulation;
  lo.recompute_loss = cfg.model.activation_checkpointing;
  lo.fused_kernels = cfg.model.fused_cuda_kernels;
  if (cfg.model.fused_cuda_kernels) lo.attention = model::AttentionImpl::kFused;
  lo.head_chunk_rows = cfg.model.head_chunk_rows;
  lo.normalization = to_loss(cfg.loop.loss_normalization);
  lo.step_decay = cfg.loop.ttt_step_loss_decay;
  lo.lk = to_lk(cfg.loop.lk_loss_type);
  lo.kl_scale = cfg.loop.kl_scale;
  lo.kl_decay = cfg.loop.kl_decay;
  // soft_ce alone keeps the fused (and, with activation checkpointing, recomputing) path.
  const auto terms = model::parse_loss_spec(cfg.loop.loss_fn);
  if (!(terms.size() == 1 && terms[0].first == model::LossTerm::kSoftCE && terms[0].second == 1.0))
    lo.loss_terms = terms;
  return lo;
}

metrics::ProfilerOptions profiler_options(const config::TrainConfig& cfg, c10::Device device,
                                          int rank, const std::string& env_profiler_dir) {
  metrics::ProfilerOptions o;
  o.start_step = cfg.profile.start_step;
  o.num_steps = cfg.profile.num_steps;
  o.record_shapes = cfg.profile.record_shapes;
  o.gpu = !device.is_cpu();
  o.rank = rank;
  o.dir = cfg.profile.dir;
  if (o.dir.empty()) {
    o.dir = !env_profiler_dir.empty() ? env_profiler_dir
                                      : checkpoint::join_path(cfg.checkpoint.output_dir, "profile");
  }
  return o;
}

metrics::SinkContext sink_context(const config::TrainConfig& cfg, int rank, int64_t total_steps,
                                  const std::string& config_json, const RunState& state,
                                  bool restarted) {
  metrics::SinkContext sc;
  sc.rank = rank;
  sc.total_steps = total_steps;
  sc.output_dir = cfg.checkpoint.output_dir;
  sc.config_json = config_json;
  sc.wandb_run_id = state.wandb_run_id;  // from the checkpoint resumed from, if any
  sc.mlflow_run_id = state.mlflow_run_id;
  // Also a fresh start (step 0): records of an earlier attempt that saved nothing move aside.
  sc.resumed_step = state.step;
  sc.tensorboard_resumed_step = state.step > 0 || restarted ? state.step : -1;
  return sc;
}

int64_t warmup_steps(const config::TrainConfig& cfg, int64_t total_steps) {
  return cfg.optim.warmup_steps ? *cfg.optim.warmup_steps
                                : optim::warmup_steps(cfg.optim.warmup_ratio, total_steps);
}

model::MemoryPlan memory_plan(const config::TrainConfig& cfg, c10::Device device,
                              int64_t micro_batch, int64_t world, int64_t node_ranks) {
  using S = config::ShardingStrategy;
  const S s = cfg.shard.strategy;
  model::MemoryPlan m;
  m.max_length = cfg.data.max_length;
  m.micro_batch = micro_batch;
  if (cfg.loop.packing) {
    // A packed micro-batch: one row of up to the budget's tokens (bounded above by one sample
    // of that length, whose attention and rows are the most a row of that many tokens holds).
    m.max_length =
        cfg.loop.packing_budget > 0 ? cfg.loop.packing_budget : cfg.data.max_length * micro_batch;
    m.micro_batch = 1;
  }
  m.ttt_length = cfg.model.ttt_length;
  m.activation_checkpointing = cfg.model.activation_checkpointing;
  m.head_chunk_rows = cfg.model.head_chunk_rows;
  m.compute_bytes = cfg.shard.mixed_precision == config::Precision::kBF16 ? 2 : 4;
  m.shard_ranks = s == S::kNoShard ? 1 : s == S::kHybridShard ? node_ranks : world;
  m.whole_compute_copy = s == S::kNoShard || s == S::kShardGradOp;
  m.state_on_host = cfg.shard.cpu_offload && !device.is_cpu();
  m.ranks_sharing_memory = device.is_cpu() ? node_ranks : 1;
  m.seq_parallel = cfg.loop.sp_ulysses_size;
  return m;
}

}  // namespace fsdp::train
