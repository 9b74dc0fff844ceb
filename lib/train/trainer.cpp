// The Trainer's set-up: ranks, device, data, the model under the sharding engine, evaluation
// (train/trainer.h). Checkpoints are in trainer_checkpoints.cpp, the loop in train_loop.cpp;
// each component's options come from component_options.h.
#include "train/trainer.h"
#include "train/trainer_impl.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/target_keys.h"
#include "comm/runtime.h"
#include "config/options.h"
#include "core/env.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/final_norm.h"
#include "data/loader.h"
#include "data/loss_mask_stats.h"
#include "data/sampler.h"
#include "kernels/fused.h"
#include "metrics/meters.h"
#include "metrics/sinks.h"
#include "optim/lr_schedule.h"
#include "shard/engine.h"
#include "train/algo/registry.h"
#include "train/component_options.h"
#include "train/evaluator.h"
#include "train/run_state.h"
#include "train/signals.h"
#include "train/step_metrics.h"
#include "train/step_runner.h"

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
  // must not share a GPU. NCCL refuses a communicator with a GPU twice ("invalid usage", seen on
  // an H200 with 2 ranks): name the cause before it does.
  const int local = comm::topology().machine_local_rank;
  FSDP_USAGE_CHECK(
      local < gpus,
      fsdp::str("--device cuda: rank ", comm::topology().world_rank, " is rank ", local,
                " on its machine, which has ", gpus, " GPU(s): NCCL needs one GPU per rank"),
      fsdp::str("start at most ", gpus, " ranks per machine (mpirun -np / --nproc-per-node)",
                ", or train on the CPU with --device cpu"));
  c10::Device dev(c10::kCUDA, static_cast<c10::DeviceIndex>(local));
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(dev);
  return dev;
}

}  // namespace

bool fused_kernels_on(const config::TrainConfig& cfg, const c10::Device& device) {
  const bool given = cfg.given_options.count("fused-cuda-kernels") > 0;
  if (!cfg.model.fused_cuda_kernels) return false;
  if (!given) return !device.is_cpu() && kernels::compiled();  // the default: where they run
  FSDP_USAGE_CHECK(!device.is_cpu(), "--fused-cuda-kernels: this run is on the CPU",
                   "the kernels run on a GPU: use --device cuda there, or pass "
                   "--fused-cuda-kernels false");
  FSDP_USAGE_CHECK(kernels::compiled(),
                   "--fused-cuda-kernels: this fsdp-train was built without its CUDA kernels",
                   "build against a CUDA LibTorch (FSDP_GPU=CUDA), or pass the flag false");
  return true;
}

Trainer::Trainer(config::TrainConfig cfg) : impl_(std::make_unique<Impl>(std::move(cfg))) {}
Trainer::~Trainer() = default;

void Trainer::Impl::setup() {
  const auto& machine = comm::topology();
  // Sequence-parallel groups of consecutive ranks (validate() checks that sp divides world).
  topo = RunTopology(machine.world_rank, machine.world_size, cfg.loop.sp_ulysses_size);
  const int world = topo.world();
  comm::set_default_timeout(std::chrono::minutes(cfg.runtime.dist_timeout_minutes));
  config::ValidateOptions vo;
  vo.training = !cfg.loop.eval_only;
  config::validate(cfg, world, vo, machine.local_size);
  if (cfg.data.stream && vo.training) {
    check_stream_options();
    // A stream's truncated or corrupt arrival is skipped with a count, never the end of the run.
    cfg.data.skip_bad_samples = true;
  }
  plan_batches();
  const c10::Device device = pick_device(cfg.runtime.device);
  cfg.model.fused_cuda_kernels = fused_kernels_on(cfg, device);
  const std::string threads = set_threads(machine);
  topo.connect(device);
  config_json = config::to_json(config::with_absolute_paths(cfg));
  if (topo.is_root()) {
    FSDP_LOG0(kInfo) << "fsdp-train: " << world << " rank(s) on " << machine.num_nodes
                     << " node(s), device " << metrics::device_name(device) << ", " << threads
                     << ", " << env::allocator_in_use() << "\n"
                     << config::to_display(cfg);
  }
  choose_algorithm();
  algo->check_supported();
  algo->plan_serving();
  // Before any data or weights are read: a run that cannot fit stops here with the numbers.
  algo->check_memory(
      memory_plan(cfg, device, plan.micro_batch, world, machine.local_size),
      device.is_cpu() ? model::host_memory_bytes() : metrics::device_total_memory(device),
      device.is_cpu() ? "this host's memory" : metrics::device_name(device));
  open_data();
  check_loss_masks();
  // An evaluation set without one micro-batch per rank would only fail at the first
  // evaluation, after the training before it.
  if (eval_ds && (cfg.loop.eval_only || cfg.eval.eval_interval > 0 || cfg.eval.eval_steps > 0)) {
    Evaluator(cfg, topo, plan, *algo, eval_ds).check_size();
    Evaluator(cfg, topo, plan, *algo, eval_ds).warn_left_out();
  }
  if (!cfg.model.init_checkpoint.empty()) {
    init_export = checkpoint::read_draft_export(cfg.model.init_checkpoint);
    have_init_export = true;
    algo->check_same_architecture(init_export.config_path, "--init-checkpoint");
  }
  if (!cfg.loop.eval_only && !cfg.checkpoint.output_dir.empty()) checkpointer.lock_output_dir();
  if (!cfg.loop.eval_only || cfg.checkpoint.resume != config::ResumeMode::kNone)
    checkpointer.plan_resume();
  if (checkpointer.resuming()) {
    algo->check_same_architecture(
        checkpoint::join_path(checkpointer.resume_candidates().front().path,
                              checkpoint::layout::kConfig),
        "--resume");
  }
  build_model();
}

void Trainer::Impl::plan_batches() {
  if (cfg.loop.eval_only) {
    // No optimizer steps: only the micro-batch matters (the training batch need not divide).
    FSDP_USAGE_CHECK(cfg.loop.draft_micro_batch_size > 0,
                     fsdp::str("--draft-micro-batch-size must be positive, got ",
                               cfg.loop.draft_micro_batch_size),
                     "set --draft-micro-batch-size to 1 or more");
    plan.micro_batch = cfg.loop.draft_micro_batch_size;
    plan.dp_size = topo.dp_world();
    plan.global_batch = plan.micro_batch * topo.dp_world();
    plan.accumulation_steps = 1;
  } else {
    plan = config::batch_plan(cfg, topo.world());
  }
}

std::string Trainer::Impl::set_threads(const comm::Topology& machine) const {
  // --threads, else OMP_NUM_THREADS as PyTorch honours it (torchrun and Slurm scripts set it),
  // else the node's cores divided among its ranks.
  // A value that is not a whole number in the table's range (1..4096) is ignored, as unset.
  const env::Reading omp = env::read("OMP_NUM_THREADS");
  const int omp_threads = omp.error.empty() && omp.integer ? static_cast<int>(*omp.integer) : 0;
  const int threads = cfg.runtime.threads > 0 ? static_cast<int>(cfg.runtime.threads)
                      : omp_threads > 0
                          ? omp_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                            std::max(1, machine.local_size));
  at::set_num_threads(threads);
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 &&
      static_cast<int64_t>(threads) * machine.local_size > static_cast<int64_t>(cores) &&
      topo.is_root()) {
    FSDP_LOG0(kWarn) << machine.local_size << " rank(s) x " << threads << " thread(s) on a machine "
                     << "with " << cores << " cores: oversubscribed threads slow every rank "
                     << "down (--threads 0 without OMP_NUM_THREADS divides the cores among "
                     << "the ranks)";
  }
  return std::to_string(threads) + " thread(s) per rank" +
         (cfg.runtime.threads > 0 ? ""
          : omp_threads > 0       ? " (OMP_NUM_THREADS)"
                                  : " (cores / ranks)");
}

void Trainer::Impl::choose_algorithm() {
  algo::Context ctx;
  ctx.cfg = &cfg;
  ctx.device = topo.device();
  ctx.is_root = topo.is_root();
  ctx.control = topo.control_ptr();
  ctx.seq_group = topo.seq_group();
  // Packed, each sample weighs as a micro-batch of one.
  ctx.accumulation =
      cfg.loop.packing ? plan.accumulation_steps * plan.micro_batch : plan.accumulation_steps;
  algo = algo::make_algorithm(ctx);
}

void Trainer::Impl::open_data() {
  const data::DatasetOptions dso = algo->dataset_options();
  if (cfg.data.stream && !cfg.loop.eval_only) {
    open_stream();
  } else if (!cfg.data.train_hidden_states_path.empty()) {
    train_ds = data::open_feature_dataset(cfg.data.train_hidden_states_path, dso);
  }
  if (!cfg.data.eval_hidden_states_path.empty()) {
    eval_ds = data::open_feature_dataset(cfg.data.eval_hidden_states_path, dso);
  }
  // Dumps that keep the target's last layer before its final norm (speculators) get that norm
  // applied in the loader, so the target head sees what a SpecForge dump holds.
  std::optional<std::pair<checkpoint::FinalNormSpec, at::Tensor>> norm;  // read once, if needed
  for (auto* ds : {&train_ds, &eval_ds}) {
    if (!*ds || !(*ds)->hidden_state_prenorm()) continue;
    if (!norm) {
      const checkpoint::FinalNormSpec spec =
          checkpoint::resolve_final_norm(cfg.model.target_model_path);
      norm.emplace(
          spec,
          checkpoint::read_model_tensors(cfg.model.target_model_path, {spec.key}).at(spec.key));
    }
    FSDP_LOG0(kInfo) << (*ds)->root() << ": " << (*ds)->format()
                     << " features hold the last hidden state before the target's final norm; "
                        "applying "
                     << norm->first.key << " (eps " << norm->first.eps << ") when reading";
    *ds = data::with_final_norm(*ds, norm->second, norm->first.eps);
  }
  for (const auto& [ds, flag] : {std::pair{train_ds, "--train-hidden-states-path"},
                                 std::pair{eval_ds, "--eval-hidden-states-path"}}) {
    if (ds) algo->check_dataset(*ds, flag);
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
}

void Trainer::Impl::check_loss_masks() const {
  // Loss masks: a set without loss tokens (or almost none) would train at loss 0 and grad
  // norm 0 without any error (SpecForge issue #392). Counted (every native sample, at most 4096
  // .ckpt files) in parallel over the ranks, all-reduced: every rank decides alike.
  const bool evaluates =
      cfg.loop.eval_only || cfg.eval.eval_interval > 0 || cfg.eval.eval_steps > 0;
  for (const auto& [ds, flag, used] :
       {std::tuple{train_ds, "--train-hidden-states-path", !cfg.loop.eval_only || !eval_ds},
        std::tuple{eval_ds, "--eval-hidden-states-path", evaluates}}) {
    if (!ds || ds->size() == 0 || !used) continue;
    Stopwatch w;
    const data::LossMaskCount c =
        data::count_loss_mask(*ds, cfg.data.max_length, topo.control_ptr());
    FSDP_LOG0(kInfo) << flag << ": " << c.loss_tokens << " loss tokens in " << c.tokens
                     << " tokens ("
                     << fsdp::str(std::fixed, std::setprecision(1), 100.0 * c.share()) << "%), "
                     << c.zero_loss_samples << " of " << c.samples
                     << " samples without any (counted in "
                     << fsdp::str(std::setprecision(2), w.seconds()) << " s)";
    data::check_loss_mask(c, flag, ds->root());
  }
}

void Trainer::Impl::build_model() {
  algo::WeightSources weights;
  if (have_init_export) weights.init = &init_export;
  const auto& candidates = checkpointer.resume_candidates();
  if (!candidates.empty()) weights.resume_dir = candidates.front().path;
  algo->build(weights, train_ds ? train_ds.get() : eval_ds.get());
  evaluator = std::make_unique<Evaluator>(cfg, topo, plan, *algo, eval_ds ? eval_ds : train_ds);
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
  r.final_eval = evaluator->evaluate("eval");
  r.steps = state.step;
  if (topo.is_root()) {
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
