// Whole-configuration validation at start-up (train_config.h): every message names the flag to
// change. Checks only what can be known from the configuration, the world size and the file
// system; sizes that must agree with the target model are checked where the model is loaded.
#include "config/train_config.h"

#include "config/discovery/discover.h"
#include "config/discovery/hf_cache.h"
#include "config/options.h"
#include "config/value_parse.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "model/ttt_loss.h"

namespace fsdp::config {

const char* to_string(ShardingStrategy v) {
  switch (v) {
    case ShardingStrategy::kFullShard:
      return "full_shard";
    case ShardingStrategy::kShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::kNoShard:
      return "no_shard";
    case ShardingStrategy::kHybridShard:
      return "hybrid_shard";
  }
  return "?";
}
const char* to_string(Precision v) {
  return v == Precision::kBF16 ? "bf16" : "fp32";
}
const char* to_string(LossNormalization v) {
  return v == LossNormalization::kBatch ? "batch" : "tokens";
}
const char* to_string(DeviceKind v) {
  switch (v) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}
const char* to_string(LrScheduler v) {
  switch (v) {
    case LrScheduler::kCosine:
      return "cosine";
    case LrScheduler::kLinear:
      return "linear";
    case LrScheduler::kConstant:
      return "constant";
  }
  return "?";
}

const char* to_string(NoiseType v) {
  switch (v) {
    case NoiseType::kUniform:
      return "uniform";
    case NoiseType::kGaussian:
      return "gaussian";
  }
  return "?";
}

bool TrainConfig::reports_to(MetricSink sink) const {
  return std::find(metrics.report_to.begin(), metrics.report_to.end(), sink) !=
         metrics.report_to.end();
}

BatchPlan batch_plan(const TrainConfig& cfg, int world_size) {
  BatchPlan p;
  p.global_batch = cfg.loop.draft_global_batch_size;
  p.micro_batch = cfg.loop.draft_micro_batch_size;
  FSDP_USAGE_CHECK(world_size > 0, str("world size must be positive, got ", world_size),
                   "start at least one rank (mpirun -np N or --nproc-per-node N)");
  const int64_t sp = cfg.loop.sp_ulysses_size;
  FSDP_USAGE_CHECK(sp >= 1 && world_size % sp == 0,
                   str("--sp-ulysses-size ", sp, " does not divide the ", world_size, " ranks"),
                   str("start a multiple of ", sp,
                       " ranks (data-parallel size x sequence-parallel size), or change "
                       "--sp-ulysses-size"));
  world_size = static_cast<int>(world_size / sp);  // the data-parallel ranks from here on
  p.dp_size = world_size;
  FSDP_USAGE_CHECK(p.global_batch > 0,
                   str("--draft-global-batch-size must be positive, got ", p.global_batch),
                   "give the samples per optimizer step over all ranks, e.g. 16");
  FSDP_USAGE_CHECK(p.micro_batch > 0,
                   str("--draft-micro-batch-size must be positive, got ", p.micro_batch),
                   "give the samples per forward on one rank, e.g. 1");
  FSDP_USAGE_CHECK(world_size > 0, str("world size must be positive, got ", world_size),
                   "start at least one rank (mpirun -np N or --nproc-per-node N)");
  const int64_t per_step = p.micro_batch * world_size;
  FSDP_USAGE_CHECK(p.global_batch % per_step == 0,
                   str("--draft-global-batch-size ", p.global_batch, " is not a multiple of ",
                       "--draft-micro-batch-size ", p.micro_batch, " x ", world_size,
                       " data-parallel ranks = ", per_step),
                   str("set --draft-global-batch-size to a multiple of ", per_step, " (e.g. ",
                       std::max<int64_t>(per_step, p.global_batch / per_step * per_step),
                       "), or change --draft-micro-batch-size or the number of ranks"));
  p.accumulation_steps = p.global_batch / per_step;
  if (cfg.loop.gradient_accumulation_steps) {
    FSDP_USAGE_CHECK(
        *cfg.loop.gradient_accumulation_steps == p.accumulation_steps,
        str("--gradient-accumulation-steps ", *cfg.loop.gradient_accumulation_steps,
            " disagrees with --draft-global-batch-size ", p.global_batch, " / (", world_size,
            " ranks x --draft-micro-batch-size ", p.micro_batch, ") = ", p.accumulation_steps),
        "drop --gradient-accumulation-steps (it is derived) or make the global "
        "batch equal micro x accumulation x ranks");
  }
  return p;
}

namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void check_dir(const std::string& p, const char* flag) {
  FSDP_USAGE_CHECK(is_dir(p), str(flag, " '", p, "' is not a directory"),
                   str("check the path given to ", flag));
  FSDP_USAGE_CHECK(::access(p.c_str(), R_OK | X_OK) == 0, str(flag, " '", p, "' is not readable"),
                   "fix the permissions");
}
void check_file(const std::string& p, const char* flag) {
  FSDP_USAGE_CHECK(is_file(p), str(flag, " '", p, "' is not a file"),
                   str("check the path given to ", flag));
  FSDP_USAGE_CHECK(::access(p.c_str(), R_OK) == 0, str(flag, " '", p, "' is not readable"),
                   "fix the permissions");
}

}  // namespace

namespace {

// Every numeric option within its bounds (the option table's, also checked when parsed: this
// catches configurations built in code), and no option given without the one it depends on.
void validate_table(const TrainConfig& cfg) {
  for (const OptionSpec& spec : option_table()) {
    if (spec.alias_of.empty() && !spec.cli_only) spec.check_value(cfg);
  }
  check_option_dependencies(cfg);
}

// The loop: batch arithmetic, the objective, packing, the length of the run.
void validate_loop(const TrainConfig& cfg, int world_size, bool train) {
  if (train) batch_plan(cfg, world_size);    // an evaluation only needs a micro-batch
  model::parse_loss_spec(cfg.loop.loss_fn);  // a bad --loss-fn fails before anything is loaded
  if (cfg.loop.packing && cfg.loop.packing_budget > 0) {
    FSDP_USAGE_CHECK(cfg.loop.packing_budget >= cfg.data.max_length,
                     str("--packing-budget ", cfg.loop.packing_budget, " is below --max-length ",
                         cfg.data.max_length, ": a sample of max length would fit no micro-batch"),
                     str("give --packing-budget at least ", cfg.data.max_length,
                         " (or 0: max length x micro-batch size)"));
  }
  if (cfg.loop.max_steps && cfg.loop.total_steps) {
    FSDP_USAGE_CHECK(
        *cfg.loop.max_steps <= *cfg.loop.total_steps,
        str("--max-steps ", *cfg.loop.max_steps, " is past --total-steps ", *cfg.loop.total_steps),
        "--max-steps stops early inside the schedule; lower it or raise "
        "--total-steps");
  }
}

void validate_optim(const TrainConfig& cfg) {
  const auto& o = cfg.optim;
  if (o.warmup_steps && cfg.loop.total_steps) {
    FSDP_USAGE_CHECK(
        *o.warmup_steps <= *cfg.loop.total_steps,
        str("--warmup-steps ", *o.warmup_steps, " exceeds --total-steps ", *cfg.loop.total_steps),
        "lower --warmup-steps");
  }
}

// Sequence parallelism against the ranks, the micro-batch, packing and SpecForge's own
// parallelism flags.
void validate_sequence_parallel(const TrainConfig& cfg, int world_size) {
  const int64_t sp = cfg.loop.sp_ulysses_size;
  FSDP_USAGE_CHECK(sp >= 1 && world_size % sp == 0,
                   str("--sp-ulysses-size ", sp, " does not divide the ", world_size, " ranks"),
                   str("start a multiple of ", sp,
                       " ranks (data-parallel size x sequence-parallel size), or change "
                       "--sp-ulysses-size"));
  for (const char* flag : {"attention-backend", "draft-attention-backend"}) {
    const auto it = cfg.specforge_flags.find(flag);
    FSDP_USAGE_CHECK(
        it == cfg.specforge_flags.end() || detail::to_lower(it->second) != "usp" || sp > 1,
        str("--", flag, " usp is SpecForge's sequence parallelism, and --sp-ulysses-size is 1"),
        "give --sp-ulysses-size 2 or more (fsdp-train's Ulysses sequence "
        "parallelism), or drop the flag");
  }
  if (sp > 1) {
    FSDP_USAGE_CHECK(
        cfg.loop.draft_micro_batch_size == 1,
        str("--sp-ulysses-size ", sp, " with --draft-micro-batch-size ",
            cfg.loop.draft_micro_batch_size, ": sequence parallelism shards one sample at a time"),
        "use --draft-micro-batch-size 1 (raise the accumulation through "
        "--draft-global-batch-size instead)");
    FSDP_USAGE_CHECK(!cfg.loop.packing,
                     str("--sp-ulysses-size ", sp,
                         " with --packing: a packed micro-batch holds several samples, a "
                         "sequence-parallel group shards one"),
                     "drop --packing (sequence parallelism is for samples too long to pack)");
  }
  if (const auto dp = cfg.specforge_flags.find("dp-size"); dp != cfg.specforge_flags.end()) {
    FSDP_USAGE_CHECK(
        dp->second == std::to_string(world_size / sp),
        str("--dp-size ", dp->second, " but the job has ", world_size / sp,
            " data-parallel ranks (", world_size, " ranks / --sp-ulysses-size ", sp, ")"),
        "drop --dp-size (it is the ranks over the sequence-parallel size) or start that many "
        "ranks");
  }
}

// W&B refuses these project names only when the side process creates the run, after the
// start-up: checked here instead. Run names (display names) may hold any printable text.
void validate_trackers(const MetricsConfig& m) {
  const auto control = [](char ch) { return static_cast<unsigned char>(ch) < 0x20; };
  const auto& wp = m.wandb_project;
  FSDP_USAGE_CHECK(wp.size() <= 128,
                   str("--wandb-project is ", wp.size(), " characters long; W&B allows 128"),
                   "give a shorter --wandb-project");
  FSDP_USAGE_CHECK(wp.find_first_of("/\\#?%:") == std::string::npos &&
                       std::none_of(wp.begin(), wp.end(), control),
                   str("--wandb-project '", wp,
                       "' contains a character W&B does not allow in "
                       "project names (any of / \\ # ? % : or a control character)"),
                   "give a plain name, e.g. --wandb-project eagle3-llama3-8b");
  const auto& wn = m.wandb_name;
  FSDP_USAGE_CHECK(wn.size() <= 128,
                   str("--wandb-name is ", wn.size(), " characters long; W&B allows 128"),
                   "give a shorter --wandb-name");
  FSDP_USAGE_CHECK(std::none_of(wn.begin(), wn.end(), control),
                   "--wandb-name contains a control character (a newline, a tab, ...)",
                   "give a name on one line of printable characters");
}

// The sharding engine's policy against the node layout (ranks per node, 0 = unknown).
void validate_sharding(const ShardConfig& s, int world_size, int ranks_per_node) {
  if (s.strategy == ShardingStrategy::kHybridShard && ranks_per_node > 0) {
    FSDP_USAGE_CHECK(world_size % ranks_per_node == 0,
                     str("--sharding-strategy hybrid_shard needs the same number of ranks on "
                         "every node; ",
                         world_size, " ranks with ", ranks_per_node, " on this node"),
                     "start the same number of ranks per node, or use full_shard");
  }
  if (s.reduce_dtype == Precision::kBF16 && s.mixed_precision == Precision::kFP32) {
    FSDP_USAGE_FAIL(
        "--reduce-dtype bf16 with --mixed-precision fp32 reduces with less "
        "precision than the computation",
        "use --reduce-dtype fp32 (the default) for fp32 runs");
  }
}

// The inputs a run cannot do without; the target's path is checked here already, because a
// missing target also explains a missing draft config (none can be made).
void validate_required_inputs(const TrainConfig& cfg, const ValidateOptions& options, bool train) {
  if (train) {
    FSDP_USAGE_CHECK(
        !cfg.checkpoint.output_dir.empty(), "--output-dir is required for training",
        "give a directory for checkpoints and metrics, e.g. --output-dir ./outputs/run1");
    FSDP_USAGE_CHECK(!cfg.data.train_hidden_states_path.empty(),
                     "--train-hidden-states-path is required for training",
                     "point it at the directory of precomputed hidden states");
  }
  if (cfg.loop.eval_only && options.training) {
    FSDP_USAGE_CHECK(
        !cfg.data.eval_hidden_states_path.empty() || !cfg.data.train_hidden_states_path.empty(),
        "--eval-only needs --eval-hidden-states-path (or --train-hidden-states-path)",
        "give the hidden states to evaluate on");
    FSDP_USAGE_CHECK(
        !cfg.model.init_checkpoint.empty() || cfg.checkpoint.resume != ResumeMode::kNone,
        "--eval-only has no weights to evaluate",
        "give --init-checkpoint DIR (an exported draft) or --resume auto|PATH");
  }
  FSDP_USAGE_CHECK(!cfg.model.target_model_path.empty(), "--target-model-path is required",
                   "point it at the target model's Hugging Face directory");
  if (options.check_paths) {
    if (!is_dir(cfg.model.target_model_path) && looks_like_repo_id(cfg.model.target_model_path)) {
      FSDP_USAGE_FAIL(str("--target-model-path '", cfg.model.target_model_path, "' not found"),
                      hub_target_hint(cfg));
    }
    check_dir(cfg.model.target_model_path, "--target-model-path");
  }
  FSDP_USAGE_CHECK(!cfg.model.draft_model_config.empty(),
                   str("--draft-model-config is required: none was given, and none can be made "
                       "without the target's config.json (",
                       cfg.model.target_model_path, "/config.json)"),
                   "point it at the draft model JSON, e.g. configs/models/llama3-8B-eagle3.json, "
                   "or --target-model-path at a Hugging Face model directory");
  if (cfg.checkpoint.resume == ResumeMode::kAuto) {
    FSDP_USAGE_CHECK(!cfg.checkpoint.output_dir.empty(), "--resume auto needs --output-dir",
                     "give the --output-dir of the run to continue");
  }
}

// Every path the options name exists and is of the right kind; the model configs agree.
void validate_input_paths(const TrainConfig& cfg) {
  check_file(cfg.model.draft_model_config, "--draft-model-config");
  if (!cfg.data.train_hidden_states_path.empty())
    check_dir(cfg.data.train_hidden_states_path, "--train-hidden-states-path");
  if (!cfg.data.eval_hidden_states_path.empty())
    check_dir(cfg.data.eval_hidden_states_path, "--eval-hidden-states-path");
  if (!cfg.model.vocab_mapping_path.empty())
    check_file(cfg.model.vocab_mapping_path, "--vocab-mapping-path");
  if (!cfg.model.init_checkpoint.empty()) check_dir(cfg.model.init_checkpoint, "--init-checkpoint");
  if (cfg.checkpoint.resume == ResumeMode::kPath) check_dir(cfg.checkpoint.resume_path, "--resume");
  // SpecForge-only inputs are validated (docs/reference.md §8) but never opened.
  if (!cfg.data.train_data_path.empty()) check_file(cfg.data.train_data_path, "--train-data-path");
  if (!cfg.data.eval_data_path.empty()) check_file(cfg.data.eval_data_path, "--eval-data-path");
  if (!cfg.checkpoint.output_dir.empty() && is_file(cfg.checkpoint.output_dir)) {
    FSDP_USAGE_FAIL(str("--output-dir '", cfg.checkpoint.output_dir, "' is a file"),
                    "give a directory (it is created when missing)");
  }
  check_model_files(cfg);
}

}  // namespace

// Component by component, in the order that decides which error a user sees first.
void validate(const TrainConfig& cfg, int world_size, const ValidateOptions& options,
              int ranks_per_node) {
  const bool train = options.training && !cfg.loop.eval_only;
  validate_table(cfg);
  validate_loop(cfg, world_size, train);
  validate_optim(cfg);
  validate_sequence_parallel(cfg, world_size);
  validate_trackers(cfg.metrics);
  validate_sharding(cfg.shard, world_size, ranks_per_node);
  validate_required_inputs(cfg, options, train);
  if (options.check_paths) validate_input_paths(cfg);
}

}  // namespace fsdp::config
