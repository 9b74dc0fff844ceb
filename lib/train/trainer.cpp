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
#include "data/vocab_mapping.h"
#include "kernels/fused.h"
#include "metrics/meters.h"
#include "metrics/sinks.h"
#include "model/draft_model.h"
#include "model/flops.h"
#include "model/target_head.h"
#include "model/ttt_loss.h"
#include "optim/lr_schedule.h"
#include "shard/engine.h"
#include "train/component_options.h"
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
  const int world = topo.world(), sp = topo.sp();
  comm::set_default_timeout(std::chrono::minutes(cfg.runtime.dist_timeout_minutes));
  config::ValidateOptions vo;
  vo.training = !cfg.loop.eval_only;
  config::validate(cfg, world, vo, machine.local_size);
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
  draft_cfg = model::load_draft_config(cfg.model.draft_model_config);
  if (cfg.model.lora_rank > 0)
    model::check_lora_rank(draft_cfg, cfg.model.lora_rank, cfg.model.lora_targets);
  if (sp > 1) {
    // Ulysses gives each rank of a group heads / sp attention heads and key/value heads.
    FSDP_USAGE_CHECK(
        draft_cfg.num_attention_heads % sp == 0 && draft_cfg.num_key_value_heads % sp == 0,
        fsdp::str("--sp-ulysses-size ", sp, ": the draft (", cfg.model.draft_model_config, ") has ",
                  draft_cfg.num_attention_heads, " attention and ", draft_cfg.num_key_value_heads,
                  " key/value heads; each must be a multiple of it"),
        "choose a sequence-parallel size that divides both head counts (the "
        "llama3-8B draft: 1, 2, 4 or 8)");
  }
  resolve_serving_export();
  // Before any data or weights are read: a run that cannot fit stops here with the numbers.
  model::check_training_memory(
      draft_cfg, memory_plan(cfg, device, plan.micro_batch, world, machine.local_size),
      device.is_cpu() ? model::host_memory_bytes() : metrics::device_total_memory(device),
      device.is_cpu() ? "this host's memory" : metrics::device_name(device));
  open_data();
  check_loss_masks();
  // An evaluation set without one micro-batch per rank would only fail at the first
  // evaluation, after the training before it.
  if (eval_ds && (cfg.loop.eval_only || cfg.eval.eval_interval > 0 || cfg.eval.eval_steps > 0)) {
    check_eval_set();
  }
  if (!cfg.model.init_checkpoint.empty()) {
    init_export = checkpoint::read_draft_export(cfg.model.init_checkpoint);
    have_init_export = true;
    check_same_architecture(init_export.config_path, "--init-checkpoint");
  }
  if (!cfg.loop.eval_only && !cfg.checkpoint.output_dir.empty()) checkpointer.lock_output_dir();
  if (!cfg.loop.eval_only || cfg.checkpoint.resume != config::ResumeMode::kNone)
    checkpointer.plan_resume();
  if (checkpointer.resuming()) {
    check_same_architecture(checkpoint::join_path(checkpointer.resume_candidates().front().path,
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

void Trainer::Impl::resolve_serving_export() {
  checkpoint::ServingRequest request;
  request.draft_config_path = cfg.model.draft_model_config;
  request.draft_config_json = draft_cfg.to_json();
  request.num_aux_hidden_states = draft_cfg.num_aux_hidden_states;
  request.convention = cfg.model.aux_layer_convention;
  request.target_model_path = cfg.model.target_model_path;
  request.export_for = cfg.checkpoint.export_for;
  request.rope_scaling = cfg.checkpoint.export_rope_scaling;
  request.max_length = cfg.data.max_length;
  serving = checkpoint::plan_serving_export(request);
  if (!topo.is_root()) return;
  for (const auto& note : serving.notes) {
    if (note.warn)
      FSDP_LOG0(kWarn) << note.text;
    else
      FSDP_LOG0(kInfo) << note.text;
  }
}

std::string Trainer::Impl::export_config_json() const {
  return serving.config_json(draft_cfg.to_json());
}

void Trainer::Impl::open_data() {
  data::DatasetOptions dso;
  dso.vocab_size = draft_cfg.vocab_size;
  dso.num_aux_layers = draft_cfg.num_aux_hidden_states;
  dso.hidden_size =
      draft_cfg.target_hidden_size ? *draft_cfg.target_hidden_size : draft_cfg.hidden_size;
  if (!cfg.data.train_hidden_states_path.empty()) {
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
  // A dump that records its layers (DeepSpec's manifest) must hold the layers the draft reads.
  for (const auto& [ds, flag] : {std::pair{train_ds, "--train-hidden-states-path"},
                                 std::pair{eval_ds, "--eval-hidden-states-path"}}) {
    const auto& aux_layers = serving.aux_layers;
    if (!ds || ds->captured_layer_ids().empty() || !aux_layers) continue;
    std::vector<int64_t> hs;  // 0-based layer output id i is hidden_states[i + 1]
    for (int64_t id : ds->captured_layer_ids()) hs.push_back(id + 1);
    auto list = [](const std::vector<int64_t>& v) {
      std::string out;
      for (int64_t k : v) out += (out.empty() ? "" : ", ") + std::to_string(k);
      return "[" + out + "]";
    };
    FSDP_USAGE_CHECK(hs == aux_layers->hidden_state_index,
                     fsdp::str(flag, ": ", ds->root(), " holds target hidden_states ", list(hs),
                               " (layer outputs ", list(ds->captured_layer_ids()),
                               "), but the draft reads hidden_states ",
                               list(aux_layers->hidden_state_index), " (", aux_layers->origin, ")"),
                     "set eagle_aux_hidden_state_layer_ids in the draft config to the dump's "
                     "layers, or use features dumped for this draft");
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

void Trainer::Impl::check_eval_set() const {
  check_eval_size(*eval_ds);
  // Evaluation splits the set like training: whole micro-batches per rank (docs/data.md).
  const int64_t n = eval_ds->size();
  const int dp_world = topo.dp_world();
  const int64_t used =
      data::DistributedSampler(n, topo.dp_rank(), dp_world, plan.micro_batch, 0, false)
          .batches_per_epoch() *
      plan.micro_batch * dp_world;
  if (used < n) {
    FSDP_LOG0(kWarn) << "--eval-hidden-states-path: each evaluation uses " << used << " of the "
                     << n
                     << " samples (whole micro-batches on every data-parallel rank: " << dp_world
                     << " x micro-batch " << plan.micro_batch << "): " << n - used
                     << " sample(s) at its end are left out (a set size divisible by "
                     << dp_world * plan.micro_batch << " evaluates all)";
  }
}

void Trainer::Impl::build_model() {
  const c10::Device& device = topo.device();
  choose_vocab_mapping();
  const std::map<std::string, at::Tensor> target = read_target_tensors();
  const at::Tensor& emb = target.at("embedding");
  head = model::TargetHead(target.at("lm_head").to(c10::kBFloat16), mapping.t2d);
  head.to(device);
  // Identical initial weights on every rank: same seed before construction.
  torch::manual_seed(static_cast<uint64_t>(cfg.loop.seed));
  draft = model::Eagle3Draft(draft_cfg);
  if (cfg.model.draft_init == config::DraftInit::kNormal)
    draft->normal_init(draft_cfg.initializer_range);
  draft->load_embedding(emb);
  draft->set_vocab_mapping(mapping.d2t, mapping.t2d);
  draft->set_checkpoint_layer(cfg.model.activation_checkpointing);
  // --fused-cuda-kernels: the TTT steps' weight gradients summed inside their GEMMs (a
  // checkpointed layer recomputes and differentiates each step on its own: nothing to sum).
  draft->set_weight_grad_in_place(cfg.model.fused_cuda_kernels &&
                                  !cfg.model.activation_checkpointing);
  if (cfg.model.lora_rank > 0) {
    // Before the engine exists: it puts the frozen base into its frozen buffers (no masters, no
    // optimizer state) and only the adapters into the trainable ones.
    FSDP_USAGE_CHECK(have_init_export,
                     "--lora-rank adapts an existing draft, and no --init-checkpoint is given",
                     "give --init-checkpoint BASE (an exported draft), or drop --lora-rank to "
                     "train the whole draft");
    draft->enable_lora(cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.lora_targets);
    int64_t adapters = 0, frozen = 0;
    for (const auto& p : draft->named_parameters())
      (p.value().requires_grad() ? adapters : frozen) += p.value().numel();
    std::string targets;
    for (const auto& t : cfg.model.lora_targets) targets += (targets.empty() ? "" : ",") + t;
    FSDP_LOG0(kInfo) << "LoRA: rank " << cfg.model.lora_rank << ", alpha " << cfg.model.lora_alpha
                     << " (scale "
                     << cfg.model.lora_alpha / static_cast<double>(cfg.model.lora_rank) << ") on "
                     << targets << " of " << draft->num_layers() << " layer(s): " << adapters
                     << " adapter parameters trained, " << frozen << " frozen (the base of "
                     << cfg.model.init_checkpoint << "); checkpoints export the merged draft";
  }
  draft->to(device);

  shard::EngineOptions eo = engine_options(cfg, device);
  eo.units = draft->unit_names();  // one unit per decoder layer of a multi-layer draft
  eo.validate();
  auto groups = shard::make_comm_groups(eo.strategy, device);
  engine = std::make_unique<shard::ShardEngine>(*draft, groups, eo);
  draft->set_unit_hooks(engine.get());
  if (have_init_export) load_init_weights();
}

void Trainer::Impl::choose_vocab_mapping() {
  const int64_t V = draft_cfg.vocab_size, Vd = draft_cfg.draft_vocab();
  // Vocabulary mapping: from the checkpoint a resume loads, else the initial checkpoint (each
  // defines what its lm_head rows mean), else a mapping file, the cache, or the features.
  if (cfg.model.lora_rank > 0) {
    // The adapted draft keeps its base's lm_head rows, which mean the base's d2t/t2d: another
    // mapping would make them mean other tokens.
    FSDP_USAGE_CHECK(cfg.model.vocab_mapping_path.empty(),
                     "--vocab-mapping-path with --lora-rank: LoRA keeps the base draft's lm_head, "
                     "whose rows are the tokens of the base's own d2t/t2d",
                     "drop --vocab-mapping-path (the base's mapping is used), or fine-tune the "
                     "whole draft without --lora-rank");
    FSDP_USAGE_CHECK(!have_init_export || (init_export.d2t.defined() && init_export.t2d.defined()),
                     "--lora-rank: the --init-checkpoint " + cfg.model.init_checkpoint +
                         " has no d2t/t2d, so its lm_head rows mean unknown tokens",
                     "adapt an export that carries its vocabulary mapping (fsdp-train and "
                     "SpecForge exports do)");
  }
  std::pair<at::Tensor, at::Tensor> resumed_mapping;
  const auto& resume_candidates = checkpointer.resume_candidates();
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
    mapping = data::build_vocab_mapping(*ds, vmo, topo.control_ptr());
  }
}

std::map<std::string, at::Tensor> Trainer::Impl::read_target_tensors() const {
  const int64_t V = draft_cfg.vocab_size;
  const int64_t Ht =
      draft_cfg.target_hidden_size ? *draft_cfg.target_hidden_size : draft_cfg.hidden_size;
  // Only the embedding and the LM head are read out of the target checkpoint.
  const config::ModelConfig defaults;
  const checkpoint::TargetKeys keys = checkpoint::resolve_target_keys(
      cfg.model.target_model_path, {cfg.model.embedding_key, cfg.model.lm_head_key,
                                    cfg.model.embedding_key == defaults.embedding_key,
                                    cfg.model.lm_head_key == defaults.lm_head_key});
  if (!keys.note.empty())
    FSDP_LOG0(kInfo) << "target " << cfg.model.target_model_path << ": " << keys.note;
  auto target = checkpoint::read_model_tensors(
      cfg.model.target_model_path,
      keys.embedding_key == keys.lm_head_key
          ? std::vector<std::string>{keys.embedding_key}
          : std::vector<std::string>{keys.embedding_key, keys.lm_head_key});
  const at::Tensor& emb = target.at(keys.embedding_key);
  const at::Tensor& lmh = target.at(keys.lm_head_key);
  for (const auto& [key, t, flag] : {std::tuple{keys.embedding_key, emb, "--embedding-key"},
                                     std::tuple{keys.lm_head_key, lmh, "--lm-head-key"}}) {
    FSDP_USAGE_CHECK(t.dim() == 2 && t.size(0) == V && t.size(1) == Ht,
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               " has shape ", t.sizes(), ", the draft config (",
                               cfg.model.draft_model_config, ") needs [", V, ", ", Ht, "]"),
                     fsdp::str("check ", flag,
                               " and that vocab_size/hidden_size of the draft config "
                               "match the target model"));
    // An fp8 checkpoint keeps its scales in other tensors: a plain cast would be silently wrong.
    FSDP_USAGE_CHECK(t.scalar_type() != at::kFloat8_e4m3fn,
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               " is fp8 (F8_E4M3): a quantised checkpoint"),
                     "point --target-model-path at the bf16/fp16 checkpoint of the target model");
    // NaN/Inf here would give a draft that trains on garbage (or a NaN loss blamed on the
    // learning rate).
    FSDP_USAGE_CHECK(all_finite(t),
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               t.is_floating_point()
                                   ? " contains NaN or Inf values"
                                   : fsdp::str(" is ", t.scalar_type(), ", not floating point")),
                     "the target checkpoint is damaged or not the model's weights; check it");
  }
  FSDP_USAGE_CHECK(
      Ht == draft_cfg.hidden_size,
      fsdp::str("draft hidden_size ", draft_cfg.hidden_size, " differs from the target's ", Ht,
                "; the draft embeds target tokens with the target embedding"),
      "set hidden_size in --draft-model-config to the target's hidden size");
  return {{"embedding", emb}, {"lm_head", lmh}};
}

void Trainer::Impl::load_init_weights() {
  std::map<std::string, at::Tensor> weights(init_export.weights.begin(), init_export.weights.end());
  for (const auto& item : draft->named_parameters()) {
    const std::string& name = item.key();
    // LoRA adapters start fresh (B = 0: the adapted draft starts as the base).
    if (name == "embed_tokens.weight" || model::is_lora_tensor(name)) continue;
    FSDP_USAGE_CHECK(
        weights.count(name),
        fsdp::str("--init-checkpoint ", cfg.model.init_checkpoint, " lacks tensor '", name, "'"),
        "use an export written by fsdp-train (or SpecForge) for this draft config");
    FSDP_USAGE_CHECK(all_finite(weights.at(name)),
                     fsdp::str("--init-checkpoint ", cfg.model.init_checkpoint, ": tensor '", name,
                               "' contains NaN or Inf values"),
                     "start from an earlier checkpoint of that run");
  }
  engine->load_full_state(weights, /*allow_missing=*/true);
}

std::unique_ptr<data::DataLoader> Trainer::Impl::make_loader(
    std::shared_ptr<data::FeatureDataset> ds, bool training) const {
  data::DistributedSampler sampler(ds->size(), topo.dp_rank(), topo.dp_world(), plan.micro_batch,
                                   static_cast<uint64_t>(cfg.loop.seed), /*shuffle=*/training);
  data::LoaderOptions lo = loader_options(cfg, topo.device());
  if (training) lo.noise = noise_options(cfg);
  // Sequence parallelism: the group's ranks read the same samples, each keeping its slice.
  lo.sp_rank = topo.sp_rank();
  lo.sp_size = topo.sp();
  lo.sp_halo = cfg.model.ttt_length - 1;
  // Packing trains a whole accumulation window at once: read one window ahead.
  if (training && cfg.loop.packing)
    lo.prefetch_depth =
        static_cast<int>(std::clamp<int64_t>(plan.accumulation_steps, lo.prefetch_depth, 1024));
  lo.validate();
  return std::make_unique<data::DataLoader>(ds, sampler, lo);
}

void Trainer::Impl::check_eval_size(const data::FeatureDataset& ds) const {
  const int dp_world = topo.dp_world();
  FSDP_USAGE_CHECK(ds.size() >= static_cast<int64_t>(dp_world) * plan.micro_batch,
                   fsdp::str("evaluation data (", ds.root(), ") has ", ds.size(),
                             " samples: ", "fewer than one micro-batch per rank (", dp_world,
                             " rank(s) x ", plan.micro_batch, ")"),
                   "use more evaluation samples, fewer ranks or a smaller "
                   "--draft-micro-batch-size");
}

std::vector<std::pair<std::string, double>> Trainer::Impl::evaluate(
    const std::string& prefix, const std::function<void()>& before_failure) {
  auto ds = eval_ds ? eval_ds : train_ds;
  check_eval_size(*ds);
  auto loader = make_loader(ds, /*training=*/false);
  loader->start({0, 0});
  const c10::Device& device = topo.device();
  StepMetrics m(cfg.model.ttt_length, topo.metrics_device(), cfg.metrics.accuracy_aggregation);
  at::NoGradGuard no_grad;
  int64_t zero_loss = 0, loss_tokens = 0;  // this rank's (samples without a loss token)
  const model::LossOptions loss = loss_options(cfg, 1, topo.seq_group());
  const ReadAgreement agreement{topo.world(), [this](bool mine) { return topo.any_rank(mine); }};
  while (true) {
    auto b = read_agreed([&] { return loader->next(); }, agreement, "evaluation data loading",
                         [&](ReadFailure) {
                           if (before_failure) before_failure();
                         });
    if (!b) break;
    *b = topo.share(std::move(*b), cfg.model.ttt_length - 1);
    zero_loss += data::zero_loss_rows(*b);
    loss_tokens += b->num_loss_tokens();
    const auto rows = batch_rows(*b, cfg.model.ttt_length, device);
    m.add(forward_micro_batch(*draft, head, rows, *b, device, loss));
  }
  auto r = m.report(topo.metrics(), prefix);
  at::Tensor counts = at::tensor({zero_loss, loss_tokens}, at::kLong);
  topo.reduce_counts(counts, comm::ReduceOp::kSum);
  r.emplace_back(prefix + "/zero_loss_samples", static_cast<double>(counts[0].item<int64_t>()));
  if (counts[1].item<int64_t>() == 0) {
    FSDP_LOG0(kWarn) << prefix << ": the evaluation set had no loss tokens at all (every loss "
                     << "mask all-zero): its metrics mean nothing (docs/data.md 'Loss masks')";
  }
  if (topo.is_root() && !loader->bad_sample_summary().empty()) {
    FSDP_LOG0(kWarn) << loader->bad_sample_summary();
  }
  return r;
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
