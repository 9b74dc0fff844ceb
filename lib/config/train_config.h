// The typed run configuration of fsdp-train: one struct per component with its defaults, and the
// whole-configuration validation that runs at start-up. Values arrive here only through the
// option table (config/options.h); this file never parses flags, YAML or JSON itself.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/log.h"
#include "model/aux_layers.h"
#include "model/lora_target.h"

namespace fsdp::config {

// ZeRO stages: FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, NO_SHARD = DDP, HYBRID_SHARD =
// ZeRO-3 inside a node and replication across nodes.
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard };
// Compute/parameter dtype (master weights are always fp32) and gradient-reduction dtype.
enum class Precision { kBF16, kFP32 };
// ploss normalisation (docs/reference.md §5): kBatch divides by B*S, padding included (SpecForge
// compatible); kTokens divides by the number of valid (loss_mask == 1) tokens.
enum class LossNormalization { kBatch, kTokens };
enum class DeviceKind { kAuto, kCpu, kCuda };
// Where the optimizer step's scalars live (shard::EngineOptions::StepScalars).
enum class StepScalars { kAuto, kHost, kDevice };
// After warmup: cosine to 0 (docs/reference.md §6), linear to 0, or constant.
enum class LrScheduler { kCosine, kLinear, kConstant };
// How acc_i is aggregated over micro-batches and ranks (docs/reference.md §5): kPooled sums
// numerators and denominators first, then divides; kPerBatch averages each micro-batch's own
// acc_i (SpecForge's old offline script).
enum class AccuracyAggregation { kPooled, kPerBatch };
// --resume: kNone starts fresh, kAuto takes the newest complete checkpoint in --output-dir
// (fresh start when there is none), kPath resumes from resume_path and fails if it is missing.
enum class ResumeMode { kNone, kAuto, kPath };
// --noise-type (data/noise.h): kUniform is U(-std, std) as speculators' AddUniformNoise,
// kGaussian is N(0, std^2).
enum class NoiseType { kUniform, kGaussian };
// --draft-init: how a draft trained from scratch is initialised. kNormal: N(0,
// initializer_range) for every projection, fc and lm_head, norms 1 (Hugging Face's post_init,
// which SpecForge's drafts run); kKaimingUniform: torch.nn.Linear's own default.
enum class DraftInit { kNormal, kKaimingUniform };
// --auto-draft-config: how a draft config is made from the target when none is given
// (config/draft_auto.h). kTemplate: SpecForge's offline script (the llama3-8B-eagle3 template
// with the target's sizes); kTarget: `specforge train` (the target's architecture fields copied,
// RoPE included).
enum class AutoDraftConfig { kTemplate, kTarget };

// --lk-loss-type: SpecForge's LK objective instead of the step's loss (docs/reference.md §5);
// kNone is written "" (or "none").
enum class LkLossType { kNone, kLambda, kAlpha };

// --report-to: the metric sinks besides metrics.jsonl (always written), in the order given.
enum class MetricSink { kTensorBoard, kWandb, kMlflow };

// --strategy (SpecForge's training.strategy): the draft family a run trains. Unset, the family is
// the one the draft config's architectures names.
enum class TrainingStrategy { kEagle3, kDFlash, kDSpark, kPEagle };
// --optimizer: AdamW for every parameter, or Muon for the matrices speculators gives it (AdamW for
// the rest); --muon-adjust-lr: torch.optim.Muon's adjust_lr_fn.
enum class OptimizerKind { kAdamW, kMuon };
enum class MuonAdjustLr { kMatchRmsAdamW, kOriginal };
// --block-loss-type (SpecForge's training.loss_type): a DFlash draft's objective over its blocks:
// DFlash's cross-entropy, D-PACE's weighted one, or one of D-PACE's two factors alone.
enum class BlockLossType {
  kDFlash,
  kDPace,
  kDPaceCumulativeConfidenceOnly,
  kDPaceContinuationValueOnly
};

const char* to_string(ShardingStrategy v);
const char* to_string(Precision v);
const char* to_string(LossNormalization v);
const char* to_string(DeviceKind v);
const char* to_string(LrScheduler v);
const char* to_string(NoiseType v);
// "eagle3", "dflash", "dspark", "peagle": the --strategy row's spelling (option_table.cpp).
const char* to_string(TrainingStrategy v);
const char* to_string(OptimizerKind v);
const char* to_string(MuonAdjustLr v);

// Where the model comes from.
struct ModelConfig {
  std::string target_model_path;   // HF directory with config.json + safetensors (required)
  std::string draft_model_config;  // draft LlamaForCausalLMEagle3 JSON (required)
  std::string embedding_key = "model.embed_tokens.weight";
  std::string lm_head_key = "lm_head.weight";
  std::string vocab_mapping_path;  // ready {d2t, t2d} file; empty: build from the features
  std::string init_checkpoint;     // exported draft directory to start from; empty: random init
  int64_t ttt_length = 7;
  bool activation_checkpointing = false;
  // fsdp-train's own CUDA kernels for the soft cross-entropy and the TTT attention's diagonal
  // merge, forward and backward (docs/model.md "Fused CUDA kernels"); GPU runs only.
  bool fused_cuda_kernels = true;  // where they can run: a GPU run of a build with them
  // The chunked draft head and loss (docs/model.md "Chunked head and loss"): loss rows per chunk
  // of each TTT step's norm, lm_head and loss; 0 automatic (from the rows and Vd), -1 off.
  int64_t head_chunk_rows = 0;
  // LoRA adaptation of the --init-checkpoint draft (docs/model.md "LoRA"): rank 0 = off (full
  // fine-tuning); the adapters' scale is alpha / rank.
  int64_t lora_rank = 0;
  double lora_alpha = 16.0;
  std::vector<model::LoraTarget> lora_targets = model::all_lora_targets();
  // What the draft config's eagle_config.eagle_aux_hidden_state_layer_ids mean (the features'
  // producer's convention; model/aux_layers.h). SpecForge's: id i = output of layer i.
  model::AuxIdConvention aux_layer_convention = model::AuxIdConvention::kLayerOutput;
  DraftInit draft_init = DraftInit::kNormal;
  AutoDraftConfig auto_draft_config = AutoDraftConfig::kTemplate;
};

// Precomputed hidden states and their processing.
struct DataConfig {
  std::string train_hidden_states_path;  // required for training
  std::string eval_hidden_states_path;   // optional
  // SpecForge builds its vocab mapping from raw text with these; here they are validated,
  // recorded in the run metadata and otherwise unused.
  std::string train_data_path;
  std::string eval_data_path;
  std::string chat_template;
  std::string cache_dir = "./cache";
  int64_t max_length = 2048;
  bool skip_bad_samples = false;
  int64_t loader_threads = 0;  // reader threads per rank; 0: 1 on the CPU, 4 on a GPU
  // Noise on the aux hidden states of training samples (never evaluation); 0: off.
  double noise_std = 0;
  NoiseType noise_type = NoiseType::kUniform;
  // Streaming (docs/data.md "Streaming"): train_hidden_states_path is a spool producers fill
  // while the run trains (data/spool.h).
  bool stream = false;
  double stream_max_gb = 0;           // the spool's disk budget; 0: none
  int64_t stream_uses = 1;            // times each sample is trained before it is acknowledged
  int64_t stream_replay_window = 64;  // samples per replay window (stream_uses > 1)
  double stream_settle_s = 0;         // in-place writers: a file must rest this long
  int64_t stream_start_samples = 64;  // arrivals the start-up checks (and vocab mapping) read
};

// Optimizer and learning-rate schedule.
struct OptimConfig {
  double learning_rate = 1e-4;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 0.5;  // <= 0 disables clipping
  LrScheduler lr_scheduler = LrScheduler::kCosine;
  double warmup_ratio = 0.015;
  std::optional<int64_t> warmup_steps;  // when set, replaces warmup_ratio * total_steps
  // Muon (docs/usage.md "Optimizers"): speculators' and torch.optim.Muon's settings.
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double muon_lr_ratio = 10.0;    // Muon's learning rate over --learning-rate
  std::optional<double> muon_lr;  // set: Muon's learning rate itself (replaces the ratio)
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  double muon_weight_decay = 0.1;
  int64_t muon_ns_steps = 5;
  MuonAdjustLr muon_adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
};

// Batching, length of the run and what the loop does.
struct LoopConfig {
  int64_t num_epochs = 10;
  int64_t draft_global_batch_size = 16;
  int64_t draft_micro_batch_size = 1;
  // Unset: global / (dp * micro). When set (or given by a ds_config) it must agree.
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<int64_t> total_steps;  // unset: num_epochs * ceil(batches_per_epoch / accum)
  std::optional<int64_t> max_steps;    // stop after this optimizer step; schedule unchanged
  int64_t seed = 0;
  // Exact sequence packing (docs/usage.md "Packing"): each accumulation window's samples
  // bin-packed into micro-batches of at most packing_budget tokens (0: max_length x
  // draft_micro_batch_size), each sample normalised as a micro-batch of its own.
  bool packing = false;
  int64_t packing_budget = 0;
  // Sequence parallelism (docs/usage.md "Sequence parallelism"): ranks per group sharing each
  // sample (DeepSpeed-Ulysses); the data-parallel size is ranks / sp_ulysses_size.
  int64_t sp_ulysses_size = 1;
  LossNormalization loss_normalization = LossNormalization::kBatch;
  // The objective (model::parse_loss_spec: a name or a JSON object of weights) and the weight
  // decay per TTT step (step i weighs decay^i; SpecForge's 0.8).
  std::string loss_fn = "soft_ce";
  double ttt_step_loss_decay = 0.8;
  // SpecForge's LK objective, with its kl_scale and kl_decay.
  LkLossType lk_loss_type = LkLossType::kNone;
  double kl_scale = 1.0;
  double kl_decay = 1.0;
  bool eval_only = false;
};

// The training knobs of DFlash-family drafts (DFlash, DSpark), with SpecForge 0.2.0's names and
// defaults (its training and model sections); EAGLE3 runs do not read them.
struct DFlashConfig {
  // Anchor positions sampled per sample, each starting a block the draft predicts.
  int64_t num_anchors = 512;
  // The loss weight decays exponentially over a block's positions with this length; unset or
  // <= 0: equal weights.
  std::optional<double> loss_decay_gamma;
  // Anchor blocks per slice of the objective (their logits are recomputed in backward); 0: all
  // blocks at once.
  int64_t objective_chunk_blocks = 128;
  BlockLossType loss_type = BlockLossType::kDFlash;
  double dpace_alpha = 0.5;  // D-PACE's smoothing of the draft's probabilities, in [0, 1]
  // DSpark's weights of its cross-entropy, L1 and confidence-head terms.
  double dspark_ce_loss_alpha = 0.1;
  double dspark_l1_loss_alpha = 0.9;
  double dspark_confidence_head_alpha = 1.0;
  // Overrides of the draft config: its block_size (tokens per block), and the token id of the
  // masked positions of a block. Unset: the draft config's.
  std::optional<int64_t> block_size;
  std::optional<int64_t> mask_token_id;
};

// The depth sampling of P-EAGLE drafts (docs/model.md "P-EAGLE"), with SpecForge 0.2.0's names
// and YAML defaults (its training section); other families do not read them.
struct PEagleOptions {
  int64_t num_depths = 8;              // depths 0 .. K-1 trained per step
  double down_sample_ratio = 0.8;      // r: depth d keeps a fraction max(r^d, r_min)
  double down_sample_ratio_min = 0.2;  // r_min
};

// The sharding engine's policy.
struct ShardConfig {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  Precision mixed_precision = Precision::kBF16;
  Precision reduce_dtype = Precision::kFP32;
  bool cpu_offload = false;           // master weights, gradient shard, moments, step on the host
  bool accumulate_locally = false;    // communicate gradients only on the last micro-batch
  bool reshard_between_uses = false;  // re-gather a unit at each of its T uses per forward
};

// Process and device settings.
struct RuntimeConfig {
  DeviceKind device = DeviceKind::kAuto;
  int64_t threads = 0;  // intra-op threads per rank; 0: cores / ranks on the node
  int64_t dist_timeout_minutes = 20;
  log::Level log_level = log::Level::kInfo;
  StepScalars step_scalars = StepScalars::kAuto;
};

struct CheckpointConfig {
  std::string output_dir;     // required for training
  int64_t save_interval = 1;  // epochs between saves (SpecForge); 0: no per-epoch save
  int64_t save_steps = 0;     // optimizer steps between saves; 0: off
  bool save_final = true;     // save when training ends (a signal-triggered save is separate)
  int64_t keep_last = 0;      // complete checkpoints kept; 0: keep all (the best is always kept)
  // The evaluation metric whose best value's checkpoint <output-dir>/best names ("loss" in the
  // name: lower is better); "none": no best kept (train/best_checkpoint.h).
  std::string save_best_by = "eval/accept_len";
  Precision export_dtype =
      Precision::kBF16;  // model.safetensors dtype (docs/reference.md §7: bf16)
  // Which engines config.json is written for (docs/serving.md): by default one config that
  // vLLM and SGLang both read right.
  model::ExportTarget export_for = model::ExportTarget::kEngines;
  // With LoRA: also write the adapters alone in PEFT's layout (<checkpoint>/adapter/).
  bool export_lora_adapters = false;
  std::string export_rope_scaling;  // RoPE scaling injected into exports; "": none
  ResumeMode resume = ResumeMode::kNone;
  std::string resume_path;             // when resume == kPath
  bool reset_optimizer_state = false;  // resume without the optimizer's moments / momentum
};

struct EvalConfig {
  int64_t eval_interval = 1;  // epochs between evaluations (SpecForge); 0: off
  int64_t eval_steps = 0;     // optimizer steps between evaluations; 0: off
};

struct MetricsConfig {
  int64_t log_steps = 50;
  // Extra sinks, each once; metrics.jsonl is always written. "none" and "jsonl" are accepted on
  // input and normalised away.
  std::vector<MetricSink> report_to;
  std::string tensorboard_dir;  // empty: <output-dir>/tensorboard
  std::string wandb_project;
  std::string wandb_name;
  bool wandb_offline = false;  // WANDB_MODE=offline for the side process
  std::string wandb_dir;       // empty: the output directory
  // Never saved, printed or logged: passed to the W&B side process through its environment.
  std::string wandb_key;
  // Empty: MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME / MLFLOW_RUN_NAME, else a file store in
  // <output-dir>/mlruns, experiment "fsdp-train", a name MLflow picks.
  std::string mlflow_tracking_uri;
  std::string mlflow_experiment_name;
  std::string mlflow_run_name;
  std::optional<double> mfu_peak_tflops;  // unset: known GPU table, n/a on CPU
  AccuracyAggregation accuracy_aggregation = AccuracyAggregation::kPooled;
};

// A trace of a few optimizer steps (SpecForge's --profile flags): the LibTorch profiler records
// operators (and GPU kernels on a GPU) for steps start_step+1 .. start_step+num_steps.
struct ProfileConfig {
  bool enabled = false;
  int64_t start_step = 30;
  int64_t num_steps = 4;
  bool record_shapes = false;
  std::string dir;  // empty: $SGLANG_TORCH_PROFILER_DIR when set, else <output-dir>/profile
};

struct TrainConfig {
  // The draft family trained; unset: chosen from the draft config's architectures.
  std::optional<TrainingStrategy> strategy;
  ModelConfig model;
  DFlashConfig dflash;
  PEagleOptions peagle;
  DataConfig data;
  OptimConfig optim;
  LoopConfig loop;
  ShardConfig shard;
  RuntimeConfig runtime;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  MetricsConfig metrics;
  ProfileConfig profile;
  std::string config_file;       // --config, recorded for the run metadata
  std::string deepspeed_config;  // --deepspeed, recorded for the run metadata
  // Flags of other SpecForge versions that have no effect here (--tp-size 1, --cache-key, ...):
  // flag name -> value as given, validated when set and recorded in the run metadata.
  std::map<std::string, std::string> specforge_flags;
  // Options the user gave explicitly (resolve() fills it): option name -> where ("--lora-alpha",
  // "run.yaml"). Defaults and ds_config translations are not in it. The dependency rule
  // (options.h OptionDependency) checks only these; never saved.
  std::map<std::string, std::string> given_options;

  bool reports_to(MetricSink sink) const;
};

// Batch arithmetic (docs/reference.md §6) for a data-parallel size.
struct BatchPlan {
  int64_t global_batch = 0;
  int64_t micro_batch = 0;
  int64_t dp_size = 0;
  int64_t accumulation_steps = 0;  // global / (dp * micro)
};
// Throws UsageError naming --draft-global-batch-size / --draft-micro-batch-size when the global
// batch does not divide into dp_size * micro batches.
BatchPlan batch_plan(const TrainConfig& cfg, int world_size);

struct ValidateOptions {
  bool check_paths = true;  // input files/directories exist and are readable
  bool training = true;     // training needs --output-dir and --train-hidden-states-path
};

// Whole-configuration check at start-up: ranges, batch arithmetic for world_size data-parallel
// ranks, hybrid sharding against the node layout (pass the ranks per node, 0 = unknown), and
// (optionally) that input paths exist. Throws UsageError whose message names the flag to change.
void validate(const TrainConfig& cfg, int world_size, const ValidateOptions& options = {},
              int ranks_per_node = 0);

}  // namespace fsdp::config
