// The training loop and its set-up (train/trainer.h).
#include "train/trainer.h"
#include "train/trainer_impl.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "comm/runtime.h"
#include "core/fs_util.h"
#include "config/options.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/vocab_mapping.h"
#include "metrics/meters.h"
#include "metrics/sinks.h"
#include "model/draft_model.h"
#include "model/flops.h"
#include "model/target_head.h"
#include "model/ttt_loss.h"
#include "optim/lr_schedule.h"
#include "shard/engine.h"
#include "train/run_state.h"
#include "train/signals.h"
#include "train/step_metrics.h"

namespace fsdp::train {

namespace {

c10::Device pick_device(config::DeviceKind kind) {
  const int gpus = comm::gpu_count();
  if (kind == config::DeviceKind::kCpu || (kind == config::DeviceKind::kAuto && gpus == 0)) {
    return c10::Device(c10::kCPU);
  }
  FSDP_USAGE_CHECK(gpus > 0, "--device cuda: no GPU is visible to this process",
                   "use --device cpu, or check the driver and CUDA_VISIBLE_DEVICES");
  // The machine's rank, not the (possibly pretend) node's: two pretend nodes on one machine
  // must not share a GPU (NCCL refuses a communicator with a GPU twice).
  c10::Device dev(c10::kCUDA,
                  static_cast<c10::DeviceIndex>(comm::topology().machine_local_rank % gpus));
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(dev);
  return dev;
}

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
  return shard::Strategy::kFullShard;
}

c10::ScalarType to_dtype(config::Precision p) {
  return p == config::Precision::kBF16 ? c10::kBFloat16 : c10::kFloat;
}

}  // namespace

Trainer::Trainer(config::TrainConfig cfg) : impl_(std::make_unique<Impl>(std::move(cfg))) {}
Trainer::~Trainer() = default;

void Trainer::Impl::setup() {
  const auto& topo = comm::topology();
  rank = topo.world_rank;
  world = topo.world_size;
  comm::set_default_timeout(std::chrono::minutes(cfg.runtime.dist_timeout_minutes));
  config::ValidateOptions vo;
  vo.training = !cfg.loop.eval_only;
  config::validate(cfg, world, vo, topo.local_size);
  plan = config::batch_plan(cfg, world);
  device = pick_device(cfg.runtime.device);
  // --threads, else OMP_NUM_THREADS as PyTorch honours it (torchrun and Slurm scripts set it),
  // else the node's cores divided among its ranks.
  int omp_threads = 0;
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n <= 4096) omp_threads = static_cast<int>(n);
  }
  const int threads = cfg.runtime.threads > 0 ? static_cast<int>(cfg.runtime.threads)
                      : omp_threads > 0
                          ? omp_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                            std::max(1, topo.local_size));
  at::set_num_threads(threads);
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<int64_t>(threads) * topo.local_size > static_cast<int64_t>(cores) &&
      rank == 0) {
    FSDP_LOG0(kWarn) << topo.local_size << " rank(s) x " << threads << " thread(s) on a machine "
                     << "with " << cores << " cores: oversubscribed threads slow every rank "
                     << "down (--threads 0 without OMP_NUM_THREADS divides the cores among "
                     << "the ranks)";
  }
  control = comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
  metrics_comm = device.is_cpu() ? control : comm::make_communicator(comm::Group::kWorld, device);
  config_json = config::to_json(config::with_absolute_paths(cfg));
  if (rank == 0) {
    FSDP_LOG0(kInfo) << "fsdp-train: " << world << " rank(s) on " << topo.num_nodes
                     << " node(s), device " << metrics::device_name(device) << ", " << threads
                     << " thread(s) per rank\n"
                     << config::to_display(cfg);
  }
  draft_cfg = model::load_draft_config(cfg.model.draft_model_config);
  data::DatasetOptions dso;
  dso.vocab_size = draft_cfg.vocab_size;
  dso.hidden_size =
      draft_cfg.target_hidden_size ? *draft_cfg.target_hidden_size : draft_cfg.hidden_size;
  if (!cfg.data.train_hidden_states_path.empty()) {
    train_ds = data::open_feature_dataset(cfg.data.train_hidden_states_path, dso);
  }
  if (!cfg.data.eval_hidden_states_path.empty()) {
    eval_ds = data::open_feature_dataset(cfg.data.eval_hidden_states_path, dso);
  }
  // One sample of each set read now: features of another target (hidden size, vocabulary) stop
  // the run before any work, not at the first evaluation hours later.
  for (const auto& [ds, flag] : {std::pair{train_ds, "--train-hidden-states-path"},
                                 std::pair{eval_ds, "--eval-hidden-states-path"}}) {
    if (!ds || ds->size() == 0) continue;
    try {
      ds->read(0);
    } catch (const data::SampleReadError& e) {
      FSDP_LOG0(kWarn) << flag << ": " << e.message() << " (read again when it is needed)";
    } catch (const data::BadSampleError& e) {
      FSDP_USAGE_CHECK(cfg.data.skip_bad_samples, fsdp::str(flag, ": ", e.message()), e.hint());
      FSDP_LOG0(kWarn) << flag << ": the first sample is bad (skipped with --skip-bad-samples): "
                       << e.message();
    }
  }
  if (!cfg.model.init_checkpoint.empty()) {
    init_export = checkpoint::read_draft_export(cfg.model.init_checkpoint);
    have_init_export = true;
    check_same_architecture(init_export.config_path, "--init-checkpoint");
  }
  // One training run per output directory at a time: two would overwrite each other's
  // checkpoints and metrics. Rank 0 holds the lock until the process ends.
  if (!cfg.loop.eval_only && !cfg.checkpoint.output_dir.empty()) {
    std::string holder;
    if (rank == 0) {
      checkpoint::ensure_directory(cfg.checkpoint.output_dir);
      output_lock = std::make_unique<checkpoint::OutputDirLock>(cfg.checkpoint.output_dir);
      holder = output_lock->acquire();
      // Alone in the directory now: what crashed saves left is put back or removed.
      if (holder.empty()) {
        for (const auto& line : checkpoint::recover_interrupted_saves(cfg.checkpoint.output_dir)) {
          FSDP_LOG0(kWarn) << "output directory: " << line;
        }
      }
    }
    const bool busy = any_rank(!holder.empty());
    FSDP_USAGE_CHECK(!busy,
                     "--output-dir " + cfg.checkpoint.output_dir +
                         " is in use by another fsdp-train run" +
                         (holder.empty() ? std::string() : " (" + holder + ")"),
                     "wait for it to finish or stop it, or choose another --output-dir");
  }
  if (!cfg.loop.eval_only || cfg.checkpoint.resume != config::ResumeMode::kNone) plan_resume();
  if (!resume_candidates.empty()) {
    check_same_architecture(
        checkpoint::join_path(resume_candidates.front().path, "config.json"), "--resume");
  }
  build_model();
}

void Trainer::Impl::check_same_architecture(const std::string& saved_config,
                                            const std::string& flag) const {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(saved_config, ec)) return;  // weights-only exports
  const model::DraftConfig saved = model::load_draft_config(saved_config);
  const model::DraftConfig& now = draft_cfg;
  // Keys that give the weights their shapes: a difference is an error naming them. Others change
  // what the weights compute (RoPE, norm epsilon): a warning.
  std::string shape_diff, other_diff;
  const auto cmp = [](std::string& out, const char* key, const auto& a, const auto& b) {
    if (a != b) out += fsdp::str(out.empty() ? "" : ", ", key, " ", a, " vs ", b);
  };
  cmp(shape_diff, "hidden_size", saved.hidden_size, now.hidden_size);
  cmp(shape_diff, "intermediate_size", saved.intermediate_size, now.intermediate_size);
  cmp(shape_diff, "num_attention_heads", saved.num_attention_heads, now.num_attention_heads);
  cmp(shape_diff, "num_key_value_heads", saved.num_key_value_heads, now.num_key_value_heads);
  cmp(shape_diff, "head_dim", saved.head_dim_value(), now.head_dim_value());
  cmp(shape_diff, "vocab_size", saved.vocab_size, now.vocab_size);
  cmp(shape_diff, "draft_vocab_size", saved.draft_vocab(), now.draft_vocab());
  cmp(shape_diff, "target hidden size (fc input / 3)", saved.fc_in_features() / 3,
      now.fc_in_features() / 3);
  cmp(other_diff, "rms_norm_eps", saved.rms_norm_eps, now.rms_norm_eps);
  cmp(other_diff, "rope_theta", saved.rope_theta, now.rope_theta);
  cmp(other_diff, "rope_scaling", saved.rope_scaling_json, now.rope_scaling_json);
  cmp(other_diff, "max_position_embeddings", saved.max_position_embeddings,
      now.max_position_embeddings);
  cmp(other_diff, "hidden_act", saved.hidden_act, now.hidden_act);
  FSDP_USAGE_CHECK(shape_diff.empty(),
                   flag + ": the checkpoint's draft (" + saved_config + ") and --draft-model-config " +
                       cfg.model.draft_model_config + " differ in " + shape_diff,
                   "use the draft config the checkpoint was trained with");
  if (!other_diff.empty()) {
    FSDP_LOG0(kWarn) << flag << ": the checkpoint's draft config (" << saved_config
                     << ") and --draft-model-config differ in " << other_diff
                     << " (checkpoint vs now); the weights load, but compute differently";
  }
}

void Trainer::Impl::build_model() {
  const int64_t V = draft_cfg.vocab_size, Vd = draft_cfg.draft_vocab();
  const int64_t Ht =
      draft_cfg.target_hidden_size ? *draft_cfg.target_hidden_size : draft_cfg.hidden_size;
  // Vocabulary mapping: from the checkpoint a resume loads, else the initial checkpoint (each
  // defines what its lm_head rows mean), else a mapping file, the cache, or the features.
  std::pair<at::Tensor, at::Tensor> resumed_mapping;
  if (!resume_candidates.empty()) {
    resumed_mapping = checkpoint::read_export_mapping(resume_candidates.front().path);
  }
  if (resumed_mapping.first.defined() && resumed_mapping.second.defined()) {
    FSDP_USAGE_CHECK(resumed_mapping.first.numel() == Vd && resumed_mapping.second.numel() == V,
                     fsdp::str("--resume: d2t/t2d of ", resume_candidates.front().path, " have ",
                               resumed_mapping.first.numel(), "/", resumed_mapping.second.numel(),
                               " entries, the draft config says Vd=", Vd, " V=", V),
                     "use the draft config the checkpoint was trained with");
    mapping.d2t = resumed_mapping.first;
    mapping.t2d = resumed_mapping.second;
    FSDP_LOG0(kInfo) << "vocab mapping: the one of " << resume_candidates.front().path
                     << " (resumed)";
  } else if (have_init_export && init_export.d2t.defined() && init_export.t2d.defined()) {
    FSDP_USAGE_CHECK(
        init_export.d2t.numel() == Vd && init_export.t2d.numel() == V,
        fsdp::str("--init-checkpoint: d2t/t2d have ", init_export.d2t.numel(), "/",
                  init_export.t2d.numel(), " entries, the draft config says Vd=", Vd, " V=", V),
        "use the draft config the checkpoint was trained with");
    mapping.d2t = init_export.d2t;
    mapping.t2d = init_export.t2d;
  } else {
    auto ds = train_ds ? train_ds : eval_ds;
    FSDP_USAGE_CHECK(ds != nullptr || !cfg.model.vocab_mapping_path.empty(),
                     "no data to build the vocabulary mapping from",
                     "give --train-hidden-states-path, --eval-hidden-states-path or "
                     "--vocab-mapping-path");
    data::VocabMappingOptions vmo;
    vmo.mapping_path = cfg.model.vocab_mapping_path;
    vmo.cache_dir = cfg.data.cache_dir;
    vmo.vocab_size = V;
    vmo.draft_vocab_size = Vd;
    vmo.max_length = cfg.data.max_length;
    vmo.skip_bad_samples = cfg.data.skip_bad_samples;
    mapping = data::build_vocab_mapping(*ds, vmo, control.get());
  }
  // Only the embedding and the LM head are read out of the target checkpoint.
  auto target = checkpoint::read_model_tensors(cfg.model.target_model_path,
                                               {cfg.model.embedding_key, cfg.model.lm_head_key});
  const at::Tensor& emb = target.at(cfg.model.embedding_key);
  const at::Tensor& lmh = target.at(cfg.model.lm_head_key);
  for (const auto& [key, t, flag] : {std::tuple{cfg.model.embedding_key, emb, "--embedding-key"},
                                     std::tuple{cfg.model.lm_head_key, lmh, "--lm-head-key"}}) {
    FSDP_USAGE_CHECK(t.dim() == 2 && t.size(0) == V && t.size(1) == Ht,
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               " has shape ", t.sizes(), ", the draft config (",
                               cfg.model.draft_model_config, ") needs [", V, ", ", Ht, "]"),
                     fsdp::str("check ", flag,
                               " and that vocab_size/hidden_size of the draft config "
                               "match the target model"));
    // NaN/Inf here would give a draft that trains on garbage (or a NaN loss blamed on the
    // learning rate).
    FSDP_USAGE_CHECK(all_finite(t),
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               t.is_floating_point() ? " contains NaN or Inf values"
                                                     : fsdp::str(" is ", t.scalar_type(),
                                                                 ", not floating point")),
                     "the target checkpoint is damaged or not the model's weights; check it");
  }
  FSDP_USAGE_CHECK(
      Ht == draft_cfg.hidden_size,
      fsdp::str("draft hidden_size ", draft_cfg.hidden_size, " differs from the target's ", Ht,
                "; the draft embeds target tokens with the target embedding"),
      "set hidden_size in --draft-model-config to the target's hidden size");
  head = model::TargetHead(lmh.to(c10::kBFloat16), mapping.t2d);
  head.to(device);

  // Identical initial weights on every rank: same seed before construction.
  torch::manual_seed(static_cast<uint64_t>(cfg.loop.seed));
  draft = model::Eagle3Draft(draft_cfg);
  draft->load_embedding(emb);
  draft->set_vocab_mapping(mapping.d2t, mapping.t2d);
  draft->set_checkpoint_layer(cfg.model.activation_checkpointing);
  draft->to(device);

  shard::EngineOptions eo;
  eo.strategy = to_engine(cfg.shard.strategy);
  eo.mixed_precision.param_dtype = to_dtype(cfg.shard.mixed_precision);
  eo.mixed_precision.reduce_dtype = to_dtype(cfg.shard.reduce_dtype);
  eo.device = device;
  eo.cpu_offload = cfg.shard.cpu_offload;
  eo.reshard_between_uses = cfg.shard.reshard_between_uses;
  eo.step_scalars = cfg.runtime.step_scalars == config::StepScalars::kHost
                        ? shard::EngineOptions::StepScalars::kHost
                    : cfg.runtime.step_scalars == config::StepScalars::kDevice
                        ? shard::EngineOptions::StepScalars::kDevice
                        : shard::EngineOptions::StepScalars::kAuto;
  eo.adamw.beta1 = cfg.optim.adam_beta1;
  eo.adamw.beta2 = cfg.optim.adam_beta2;
  eo.adamw.eps = cfg.optim.adam_eps;
  eo.adamw.weight_decay = cfg.optim.weight_decay;
  eo.validate();
  auto groups = shard::make_comm_groups(eo.strategy, device);
  engine = std::make_unique<shard::ShardEngine>(*draft, groups, eo);
  draft->set_unit_hooks(engine.get());
  if (have_init_export) {
    std::map<std::string, at::Tensor> weights(init_export.weights.begin(),
                                              init_export.weights.end());
    for (const auto& item : draft->named_parameters()) {
      const std::string& name = item.key();
      if (name == "embed_tokens.weight") continue;
      FSDP_USAGE_CHECK(
          weights.count(name),
          fsdp::str("--init-checkpoint ", cfg.model.init_checkpoint, " lacks tensor '", name, "'"),
          "use an export written by fsdp-train (or SpecForge) for this draft config");
      FSDP_USAGE_CHECK(all_finite(weights.at(name)),
                       fsdp::str("--init-checkpoint ", cfg.model.init_checkpoint, ": tensor '",
                                 name, "' contains NaN or Inf values"),
                       "start from an earlier checkpoint of that run");
    }
    engine->load_full_state(weights, /*allow_missing=*/true);
  }
}

std::unique_ptr<data::DataLoader> Trainer::Impl::make_loader(
    std::shared_ptr<data::FeatureDataset> ds, bool shuffle) const {
  data::DistributedSampler sampler(ds->size(), rank, world, plan.micro_batch,
                                   static_cast<uint64_t>(cfg.loop.seed), shuffle);
  data::LoaderOptions lo;
  lo.max_length = cfg.data.max_length;
  lo.skip_bad_samples = cfg.data.skip_bad_samples;
  lo.pin_memory = !device.is_cpu();
  // Four readers on a GPU, like SpecForge's DataLoader workers: a 2k-token sample of an 8B
  // target is 64 MiB to read and unpickle per micro-batch.
  lo.prefetch_threads = static_cast<int>(
      cfg.data.loader_threads > 0 ? cfg.data.loader_threads : (device.is_cpu() ? 1 : 4));
  lo.validate();
  return std::make_unique<data::DataLoader>(ds, sampler, lo);
}

model::LossOptions Trainer::Impl::loss_options(int64_t accumulation) const {
  model::LossOptions lo;
  lo.ttt_length = cfg.model.ttt_length;
  lo.accumulation_steps = accumulation;
  lo.recompute_loss = cfg.model.activation_checkpointing;
  lo.normalization = cfg.loop.loss_normalization == config::LossNormalization::kTokens
                         ? model::LossNormalization::kValidTokens
                         : model::LossNormalization::kBatchTokens;
  return lo;
}

metrics::ProfilerOptions Trainer::Impl::profiler_options() const {
  metrics::ProfilerOptions o;
  o.start_step = cfg.profile.start_step;
  o.num_steps = cfg.profile.num_steps;
  o.record_shapes = cfg.profile.record_shapes;
  o.gpu = !device.is_cpu();
  o.rank = rank;
  o.dir = cfg.profile.dir;
  if (o.dir.empty()) {
    const char* env = std::getenv("SGLANG_TORCH_PROFILER_DIR");  // where SpecForge writes
    o.dir = env && *env ? env : checkpoint::join_path(cfg.checkpoint.output_dir, "profile");
  }
  return o;
}

std::vector<std::pair<std::string, double>> Trainer::Impl::evaluate(const std::string& prefix) {
  auto ds = eval_ds ? eval_ds : train_ds;
  auto loader = make_loader(ds, /*shuffle=*/false);
  FSDP_USAGE_CHECK(
      loader->batches_per_epoch() > 0,
      fsdp::str("evaluation data (", ds->root(), ") has ", ds->size(),
                " samples: fewer than one micro-batch per rank"),
      "use more evaluation samples, fewer ranks or a smaller --draft-micro-batch-size");
  loader->start({0, 0});
  StepMetrics m(cfg.model.ttt_length, metrics_device());
  at::NoGradGuard no_grad;
  while (auto b = loader->next()) {
    const auto rows = model::LossRows::build(b->loss_mask, cfg.model.ttt_length, device);
    auto out = model::ttt_step(*draft, head, rows, b->input_ids.to(device, true),
                               b->attention_mask.to(device, true), b->loss_mask.to(device, true),
                               b->aux_hidden.to(device, true), b->target_hidden.to(device, true),
                               loss_options(1));
    m.add(out);
  }
  auto r = m.report(*metrics_comm, prefix);
  if (rank == 0 && !loader->bad_sample_summary().empty()) {
    FSDP_LOG0(kWarn) << loader->bad_sample_summary();
  }
  return r;
}

bool Trainer::Impl::any_rank(bool mine) const {
  at::Tensor f = at::full({1}, mine ? 1 : 0, at::kInt);
  control->all_reduce(f, comm::ReduceOp::kMax)->wait();
  return f.item<int>() != 0;
}

std::string Trainer::Impl::save(int64_t epoch_for_name) {
  Stopwatch w;
  checkpoint::CheckpointWriter writer(cfg.checkpoint.output_dir, epoch_for_name, state.step);
  // A write that fails (full disk, file size limit) on any rank fails the save on every rank:
  // the collective steps still run everywhere, then the ranks agree, and the partial directory
  // goes while the earlier checkpoints stay.
  std::string error;
  auto attempt = [&](const auto& write) {
    if (!error.empty()) return;
    try {
      write();
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  };
  if (rank == 0) attempt([&] { writer.begin(); });
  control->barrier();
  // The export leaves out the frozen embedding (spec 7): it is neither gathered nor copied (for
  // the llama3-8B draft 2.1 GB of fp32 on the device and on rank 0's host per save).
  auto full = engine->full_state(/*rank0_only=*/true, /*include_frozen=*/false);
  if (rank == 0) {
    attempt([&] {
      checkpoint::write_draft_export(writer.temp_dir(), draft_cfg.to_json(), full, mapping.d2t,
                                     mapping.t2d, to_dtype(cfg.checkpoint.export_dtype));
    });
  }
  full.clear();  // not held through save_state's own host copies (1.7 GB for the llama3-8B draft)
  try {  // collective: every rank enters it, also after an error of its own
    shard::save_state(*engine, checkpoint::join_path(writer.temp_dir(), "train_state"));
  } catch (const std::exception& e) {
    if (error.empty()) error = error_text(e);
  }
  if (rank == 0) attempt([&] { save_run_state(writer.temp_dir(), state); });
  bool failed = any_rank(!error.empty());
  if (!failed && rank == 0) attempt([&] { writer.commit(/*keep_last=*/0); });
  if (!failed) failed = any_rank(!error.empty());
  // Pruning older checkpoints after the new one is complete: a failure is only a warning.
  if (!failed && rank == 0 && cfg.checkpoint.keep_last > 0) {
    try {
      checkpoint::prune(cfg.checkpoint.output_dir, cfg.checkpoint.keep_last, writer.final_dir());
    } catch (const std::exception& e) {
      FSDP_LOG(kWarn) << "after saving " << writer.final_dir() << ", removing older checkpoints "
                      << "(--keep-last) failed: " << error_text(e);
    }
  }
  if (failed) {
    if (!error.empty()) {
      FSDP_LOG(kError) << "rank " << rank << ": the checkpoint of step " << state.step
                       << " could not be written: " << error;
    }
    if (rank == 0) {
      remove_tree(writer.temp_dir());
      FSDP_LOG0(kWarn) << "checkpoint of step " << state.step << " NOT saved (see the error "
                       << "above; free space in " << cfg.checkpoint.output_dir
                       << "); training goes on and the next save tries again; "
                       << newest_checkpoint_text();
    }
    control->barrier();
    return "";
  }
  if (rank == 0) {
    FSDP_LOG0(kInfo) << "saved checkpoint " << writer.final_dir() << " (" << w.seconds() << " s)";
  }
  control->barrier();
  return writer.final_dir();
}

std::string Trainer::Impl::newest_checkpoint_text() const {
  const auto latest = checkpoint::find_latest(cfg.checkpoint.output_dir);
  return latest ? "the newest complete checkpoint is " + latest->path +
                      " (--resume continues from it)"
                : std::string("there is no complete checkpoint");
}

bool Trainer::Impl::inside_output_dir(const std::string& checkpoint_dir) const {
  // The same directory, however spelled (relative, trailing '/', symbolic links).
  std::error_code ec;
  const auto parent = std::filesystem::absolute(checkpoint_dir, ec).lexically_normal();
  return !cfg.checkpoint.output_dir.empty() &&
         std::filesystem::equivalent(
             (parent.has_filename() ? parent : parent.parent_path()).parent_path(),
             cfg.checkpoint.output_dir, ec);
}

void Trainer::Impl::check_same_checkpoints(
    const std::vector<checkpoint::CheckpointRef>& list) const {
  // Every rank must see the same checkpoints (one --output-dir shared by all): count and step
  // sum agree (the max of each and of its negation).
  int64_t step_sum = 0;
  for (const auto& c : list) step_sum += c.step;
  at::Tensor seen = at::tensor({static_cast<int64_t>(list.size()), step_sum}, at::kLong);
  at::Tensor low = -seen;
  control->all_reduce(seen, comm::ReduceOp::kMax)->wait();
  control->all_reduce(low, comm::ReduceOp::kMax)->wait();
  FSDP_USAGE_CHECK(at::equal(seen, -low),
                   "--resume: the ranks see different checkpoints in " + cfg.checkpoint.output_dir,
                   "--output-dir must be one directory shared by every rank");
}

void Trainer::Impl::plan_resume() {
  // Candidates, newest first: --resume auto falls back to older complete checkpoints when the
  // newest cannot be loaded (a damaged file); --resume PATH takes that one only.
  std::vector<checkpoint::CheckpointRef>& candidates = resume_candidates;
  candidates.clear();
  // A restart by the launcher continues from the newest checkpoint of its own launch (the
  // output directory may hold older runs' checkpoints), then falls back to where the first
  // attempt started; before this launch saved any, it starts the way the first attempt did.
  // Which checkpoints are the launch's is agreed: a rank that cannot read one's state says no.
  const LaunchAttempt launch = launch_attempt();
  std::vector<checkpoint::CheckpointRef> own;
  if (launch.attempt > 0 && !launch.launch_id.empty()) {
    const auto listing = checkpoint::list_complete(cfg.checkpoint.output_dir);
    check_same_checkpoints(listing);  // one agreement per checkpoint follows
    for (const auto& c : listing) {
      bool mine = false;
      try {
        mine = load_run_state(c.path, /*restore_rng=*/false).launch_id == launch.launch_id;
      } catch (const std::exception&) {
        // Unreadable state: not a candidate (the loading loop would only fail on it).
      }
      if (!any_rank(!mine)) own.push_back(c);
    }
    std::reverse(own.begin(), own.end());
    FSDP_LOG0(kWarn) << "restart " << launch.attempt << " of launch " << launch.launch_id << ": "
                     << (own.empty()
                             ? "no checkpoint of this launch yet, starting as the first attempt did"
                             : "resuming from " + own.front().path);
  }
  const bool restarting = !own.empty();
  resume_falls_back = restarting || cfg.checkpoint.resume == config::ResumeMode::kAuto;
  if (cfg.checkpoint.resume == config::ResumeMode::kAuto) {
    candidates = checkpoint::list_complete(cfg.checkpoint.output_dir);
    std::reverse(candidates.begin(), candidates.end());
  } else if (cfg.checkpoint.resume == config::ResumeMode::kPath) {
    const std::string dir = cfg.checkpoint.resume_path;
    const bool export_only = std::filesystem::is_regular_file(dir + "/model.safetensors") &&
                             !checkpoint::is_complete(dir) &&
                             !std::filesystem::exists(dir + "/train_state");
    FSDP_USAGE_CHECK(checkpoint::is_complete(dir),
                     "--resume " + dir + ": not a complete checkpoint directory (no " +
                         checkpoint::kCompleteMarker + " marker)",
                     export_only
                         ? "it holds weights only (a SpecForge checkpoint or an export), no "
                           "optimizer state to resume: start from its weights with "
                           "--init-checkpoint " + dir + " (or --ckpt-dir) instead of --resume"
                     : std::filesystem::exists(dir + "/train_state")
                         ? "its save was interrupted (the marker is written last), so its files "
                           "may be incomplete: resume from an older checkpoint, or --resume auto"
                         : "point --resume at an epoch_<E>_step_<S> directory, or use --resume "
                           "auto");
    // Continuing a checkpoint of another directory: this run's saves must not mix with a run
    // whose checkpoints are in --output-dir.
    if (!restarting && !cfg.loop.eval_only && !inside_output_dir(dir)) {
      const auto other = checkpoint::find_latest(cfg.checkpoint.output_dir);
      FSDP_USAGE_CHECK(!other,
                       "--resume " + dir + " is outside --output-dir " +
                           cfg.checkpoint.output_dir + ", which holds checkpoints of another run "
                           "(the newest: " + (other ? other->path : std::string()) +
                           "): the two runs' checkpoints would mix",
                       "continue into an empty --output-dir, or resume a checkpoint of " +
                           cfg.checkpoint.output_dir);
    }
    checkpoint::CheckpointRef ref;
    ref.path = dir;
    candidates.push_back(ref);
  }
  // This launch's checkpoints first, then the first attempt's starting points (not twice).
  if (restarting) {
    for (const auto& c : candidates) {
      const bool dup = std::any_of(own.begin(), own.end(), [&](const auto& o) {
        return o.path == c.path;
      });
      if (!dup) own.push_back(c);
    }
    candidates = own;
  }
  check_same_checkpoints(candidates);
  // With fallback, a checkpoint whose weights file or config cannot be read (damaged after the
  // save) is passed over like one whose training state cannot be loaded. Agreed over ranks.
  if (resume_falls_back) {
    std::vector<checkpoint::CheckpointRef> readable;
    for (const auto& c : candidates) {
      std::string problem;
      try {
        const auto [d2t, t2d] = checkpoint::read_export_mapping(c.path);
        if (!d2t.defined() || !t2d.defined()) problem = "model.safetensors has no d2t/t2d";
        const std::string config = checkpoint::join_path(c.path, "config.json");
        if (std::filesystem::is_regular_file(config)) model::load_draft_config(config);
      } catch (const std::exception& e) {
        problem = error_text(e);
      }
      if (!any_rank(!problem.empty())) {
        readable.push_back(c);
      } else {
        FSDP_LOG0(kWarn) << "checkpoint " << c.path << " cannot be resumed"
                         << (problem.empty() ? " (on another rank)" : ": " + problem)
                         << "; trying the next older one";
      }
    }
    FSDP_USAGE_CHECK(candidates.empty() || !readable.empty(),
                     "--resume: no checkpoint in " + cfg.checkpoint.output_dir +
                         " can be read (see the warnings above)",
                     "check the files named above; to start over use another --output-dir");
    candidates = readable;
  }
  if (candidates.empty()) {
    // Never start over silently next to another trainer's checkpoints: that run's epochs would
    // look resumed and be lost.
    // (--init-checkpoint says where to start.)
    const auto foreign =
        cfg.checkpoint.resume == config::ResumeMode::kAuto && cfg.model.init_checkpoint.empty()
            ? checkpoint::list_foreign_exports(cfg.checkpoint.output_dir)
            : std::vector<std::string>{};
    std::string names;
    for (size_t i = 0; i < foreign.size() && i < 3; ++i) names += (i ? ", " : "") + foreign[i];
    if (foreign.size() > 3) names += ", ...";
    FSDP_USAGE_CHECK(
        foreign.empty(),
        "--resume: " + cfg.checkpoint.output_dir + " has no fsdp-train checkpoint to resume, but " +
            std::to_string(foreign.size()) + " draft checkpoint(s) without optimizer state (" +
            names + "), e.g. from SpecForge",
        "to continue from those weights with a fresh optimizer and schedule, pass "
        "--init-checkpoint <that directory> (or --ckpt-dir) without --resume; to start over, "
        "use another --output-dir");
    if (cfg.checkpoint.resume == config::ResumeMode::kAuto) {
      FSDP_LOG0(kInfo) << "--resume auto: no complete checkpoint in " << cfg.checkpoint.output_dir
                       << ", starting fresh";
    }
    // A fresh run never overwrites an earlier run's checkpoints (its saves would replace them
    // name by name, and a later --resume would continue a mix of the two).
    if (cfg.checkpoint.resume == config::ResumeMode::kNone && !cfg.loop.eval_only &&
        !cfg.checkpoint.output_dir.empty()) {
      const auto earlier = checkpoint::find_latest(cfg.checkpoint.output_dir);
      FSDP_USAGE_CHECK(!earlier,
                       "--output-dir " + cfg.checkpoint.output_dir +
                           " already holds checkpoints of a run (the newest: " +
                           (earlier ? earlier->path : std::string()) +
                           "), and this run starts fresh: its saves would overwrite them",
                       "pass --resume to continue that run, --init-checkpoint " +
                           (earlier ? earlier->path : std::string("DIR")) +
                           " to start from its weights, or choose another --output-dir");
    }
  }
}

void Trainer::Impl::resume_if_asked() {
  const std::vector<checkpoint::CheckpointRef>& candidates = resume_candidates;
  if (candidates.empty()) return;
  const bool fall_back = resume_falls_back;
  RunState saved;
  std::string loaded;
  for (size_t i = 0;; ++i) {
    const std::string& path = candidates[i].path;
    std::string error;
    try {
      saved = load_run_state(path);
      shard::load_state(*engine, checkpoint::join_path(path, "train_state"));
    } catch (const std::exception& e) {
      error = error_text(e);
    }
    if (!any_rank(!error.empty())) {
      loaded = path;
      break;
    }
    if (!error.empty()) {
      FSDP_LOG(kError) << "rank " << rank << ": cannot load checkpoint " << path << ": " << error;
    }
    FSDP_CHECK(i + 1 < candidates.size(),
               "--resume: checkpoint " + path + " could not be loaded (see the error above)" +
                   (candidates.size() > 1 ? ", nor any older one" : ""),
               !fall_back
                   ? "pick another checkpoint, or --resume auto (it falls back to older ones)"
                   : "check the files named above; to start over use another --output-dir");
    FSDP_LOG0(kWarn) << "checkpoint " << path << " could not be loaded (see the error above): "
                     << "resuming from the next older one, " << candidates[i + 1].path;
  }
  // The mapping the model was built with came from the first candidate (build_model); a fallback
  // to an older checkpoint must mean the same vocabulary.
  if (loaded != candidates.front().path) {
    const auto [d2t, t2d] = checkpoint::read_export_mapping(loaded);
    FSDP_USAGE_CHECK(d2t.defined() && t2d.defined() && at::equal(d2t, mapping.d2t) &&
                         at::equal(t2d, mapping.t2d),
                     "--resume: " + loaded + " has another vocabulary mapping than " +
                         candidates.front().path + " (the checkpoints are of different runs)",
                     "resume one of them explicitly with --resume PATH");
  }
  // Checkpoints after the one resumed from belong to an abandoned branch: set aside, so that
  // this run's saves do not overwrite them and a later --resume auto does not take them.
  if (rank == 0 && !cfg.loop.eval_only && inside_output_dir(loaded)) {
    for (const auto& moved : checkpoint::set_aside_newer(cfg.checkpoint.output_dir, saved.step)) {
      FSDP_LOG0(kWarn) << "resumed from step " << saved.step << ": the newer checkpoint is set "
                       << "aside as " << moved << " (another branch of the run; nothing deleted)";
    }
  }
  control->barrier();
  if (have_init_export && rank == 0) {
    FSDP_LOG0(kWarn) << "--init-checkpoint " << cfg.model.init_checkpoint
                     << " is not used: the run resumes from " << loaded;
  }
  state = saved;
  if (saved.world_size != world || saved.micro_batch_size != plan.micro_batch) {
    // Different data-parallel layout: keep the number of samples consumed in the epoch.
    const int64_t samples = saved.position * saved.micro_batch_size * saved.world_size;
    state.position = samples / (plan.micro_batch * world);
    FSDP_LOG0(kWarn) << "resuming a run saved at " << saved.world_size << " rank(s) on " << world
                     << ": parameters and optimizer state are resharded exactly; the data order "
                        "continues at sample "
                     << samples << " of epoch " << saved.epoch;
  }
  state.world_size = world;
  state.accumulation_steps = plan.accumulation_steps;
  state.micro_batch_size = plan.micro_batch;
  FSDP_LOG0(kInfo) << "resumed from " << loaded << " at step " << state.step << " (epoch "
                   << state.epoch << ", micro-batch " << state.position << ")";
}

RunResult Trainer::run() {
  impl_->setup();
  return impl_->cfg.loop.eval_only ? impl_->eval_only() : impl_->train();
}

RunResult Trainer::Impl::eval_only() {
  if (cfg.checkpoint.resume != config::ResumeMode::kNone) resume_if_asked();
  FSDP_USAGE_CHECK(have_init_export || state.step > 0, "--eval-only needs weights to evaluate",
                   "give --init-checkpoint DIR (an exported checkpoint) or --resume");
  RunResult r;
  r.final_eval = evaluate("eval");
  r.steps = state.step;
  if (rank == 0) {
    std::string line = "eval:";
    for (const auto& [k, v] : r.final_eval) line += " " + k + "=" + std::to_string(v);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (!cfg.checkpoint.output_dir.empty()) {
      checkpoint::ensure_directory(cfg.checkpoint.output_dir);
      metrics::JsonlSink sink(checkpoint::join_path(cfg.checkpoint.output_dir, "metrics.jsonl"));
      sink.log(state.step, r.final_eval);
      sink.close();
    }
  }
  return r;
}

}  // namespace fsdp::train
