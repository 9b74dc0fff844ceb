// ds_config translation (docs/migration-from-deepspeed.md) on realistic ZeRO-2, ZeRO-3 and
// ZeRO-3-with-offload configs, "auto" values included, and the keys that must be rejected.
#include "compat/deepspeed.h"
#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;
using fsdp::config::test::scratch_dir;
using fsdp::config::test::write_file;

namespace {

// Typical of the Hugging Face Trainer integration: everything batch-related is "auto".
const char* kZero2 = R"({
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                           "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"},
                        "allgather_partitions": true, "allgather_bucket_size": 2e8,
                        "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 2e8,
                        "contiguous_gradients": true},
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 2000,
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

// Hand-written ZeRO-3 with explicit numbers.
const char* kZero3 = R"({
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "Adam", "params": {"lr": 5e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                           "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": 5000, "warmup_num_steps": 100,
                           "cos_min_ratio": 0.1}},
  "zero_optimization": {
    "stage": 3, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
  "tensorboard": {"enabled": true, "output_path": "tb_logs", "job_name": "eagle3"},
  "communication_data_type": "fp32"
})";

const char* kZero3Offload = R"({
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true},
    "zero_hpz_partition_size": 8,
    "stage3_gather_16bit_weights_on_model_save": true},
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 2,
  "train_batch_size": "auto",
  "wandb": {"enabled": true, "project": "eagle3-draft", "team": "mine"},
  "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false},
  "flops_profiler": {"enabled": false}
})";

std::string write_ds(const std::string& name, const std::string& text) {
  const std::string dir = scratch_dir("ds_" + name);
  write_file(dir + "/ds.json", text);
  return dir + "/ds.json";
}

bool has_line(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("ZeRO-2 with auto values keeps fsdp-train's values", "[config]") {
  std::vector<std::string> report;
  ResolveOptions ro;
  ro.world_size = 4;
  ro.report = &report;
  const TrainConfig c = resolve_args({"--deepspeed", write_ds("z2", kZero2), "--learning-rate",
                                      "2e-4", "--draft-global-batch-size", "16"},
                                     ro);
  CHECK(c.shard.strategy == ShardingStrategy::kShardGradOp);
  CHECK(c.shard.mixed_precision == Precision::kBF16);
  CHECK(c.optim.learning_rate == 2e-4);
  CHECK(c.optim.lr_scheduler == LrScheduler::kLinear);
  CHECK(c.loop.draft_global_batch_size == 16);
  CHECK(c.loop.draft_micro_batch_size == 1);
  CHECK_FALSE(c.loop.gradient_accumulation_steps.has_value());
  CHECK(c.metrics.log_steps == 2000);
  CHECK_FALSE(c.shard.cpu_offload);
  CHECK(has_line(report, "optimizer.params.lr: auto -> --learning-rate 0.0002"));
  CHECK(has_line(report, "zero_optimization.stage = 2  ->  --sharding-strategy shard_grad_op"));
  CHECK(has_line(report, "warning: zero_optimization.reduce_bucket_size: 200000000: accepted"));
  CHECK(has_line(report, "accepted and not needed"));
  CHECK(has_line(report, "overlap_comm"));
  ValidateOptions vo;
  vo.check_paths = false;
  vo.training = false;
  TrainConfig v = c;
  v.model.target_model_path = "/t";
  v.model.draft_model_config = "/d";
  CHECK_NOTHROW(validate(v, 4, vo));
}

TEST_CASE("ZeRO-3 with explicit values maps every key", "[config]") {
  std::vector<std::string> report;
  ResolveOptions ro;
  ro.world_size = 4;
  ro.hidden_size = 4096;
  ro.report = &report;
  const TrainConfig c = resolve_args({"--deepspeed", write_ds("z3", kZero3)}, ro);
  CHECK(c.shard.strategy == ShardingStrategy::kFullShard);
  CHECK(c.loop.draft_global_batch_size == 32);
  CHECK(c.loop.draft_micro_batch_size == 2);
  CHECK(c.loop.gradient_accumulation_steps == 4);
  CHECK(c.optim.max_grad_norm == 1.0);
  CHECK(c.optim.learning_rate == 5e-5);
  CHECK(c.optim.adam_beta2 == 0.95);
  CHECK(c.optim.weight_decay == 0.01);
  CHECK(c.optim.lr_scheduler == LrScheduler::kCosine);
  CHECK(c.optim.warmup_steps == 100);
  CHECK(c.loop.total_steps == 5000);
  CHECK(c.shard.reduce_dtype == Precision::kFP32);
  CHECK(c.reports_to(MetricSink::kTensorBoard));
  CHECK(c.metrics.tensorboard_dir == "tb_logs/eagle3");
  // "auto" bucket sizes derived from the hidden size as the HF integration does.
  CHECK(has_line(report, "reduce_bucket_size: auto = 16777216 (from hidden size 4096)"));
  CHECK(has_line(report, "stage3_prefetch_bucket_size: auto = 15099494"));
  CHECK(has_line(report, "stage3_param_persistence_threshold: auto = 40960"));
  CHECK(has_line(report, "warning: scheduler.params.cos_min_ratio"));
  CHECK(has_line(report, "always on: every checkpoint holds the consolidated bf16"));
  ValidateOptions vo;
  vo.check_paths = false;
  vo.training = false;
  TrainConfig v = c;
  v.model.target_model_path = "/t";
  v.model.draft_model_config = "/d";
  CHECK_NOTHROW(validate(v, 4, vo));
  // The same file at a world size that breaks its arithmetic.
  ro.world_size = 2;
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("z3b", kZero3)}, ro);
      },
      "train_batch_size 32 != train_micro_batch_size_per_gpu 2 x "
      "gradient_accumulation_steps 4 x 2 ranks = 16");
}

TEST_CASE("ZeRO-3 with optimizer and parameter offload and auto batch", "[config]") {
  std::vector<std::string> report;
  ResolveOptions ro;
  ro.world_size = 8;
  ro.report = &report;
  const TrainConfig c = resolve_args({"--deepspeed", write_ds("z3o", kZero3Offload)}, ro);
  CHECK(c.shard.cpu_offload);
  CHECK(c.shard.strategy == ShardingStrategy::kHybridShard);
  CHECK(c.loop.draft_global_batch_size == 16);  // auto = 1 x 2 x 8
  CHECK(c.loop.gradient_accumulation_steps == 2);
  CHECK(c.reports_to(MetricSink::kWandb));
  CHECK(c.metrics.wandb_project == "eagle3-draft");
  CHECK(c.model.activation_checkpointing);
  CHECK(has_line(
      report, "activation_checkpointing = (section present)  ->  --activation-checkpointing true"));
  CHECK(has_line(report, "warning: activation_checkpointing.partition_activations: ignored"));
  CHECK(has_line(report, "warning: wandb.team: ignored"));
  CHECK(has_line(report, "pin_memory"));
  CHECK(has_line(report, "hpZ"));
}

TEST_CASE("ds_config values that cannot be honoured are errors", "[config]") {
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("nvme", R"({"zero_optimization": {"stage": 3,
                        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})")});
      },
      "offload_param.device is nvme: NVMe offload is not supported");
  require_usage_error(
      [&] {
        resolve_args(
            {"--deepspeed", write_ds("fp16", R"({"fp16": {"enabled": true, "loss_scale": 0}})")});
      },
      "use bf16 instead");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("lamb", R"({"optimizer": {"type": "Lamb"}})")});
      },
      "optimizer.type 'Lamb' is not supported");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("l2", R"({"optimizer": {"type": "Adam", "params":
                        {"adam_w_mode": false, "weight_decay": 0.1}}})")});
      },
      "L2 regularisation");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("conflict", R"({"gradient_clipping": 2.0})"),
                      "--max-grad-norm", "0.5"});
      },
      "sets --max-grad-norm 2, but the command line or YAML file set 0.5");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("bad", "{ not json")});
      },
      "not valid JSON");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", write_ds("type", R"({"train_batch_size": "lots"})")});
      },
      "train_batch_size: expected an integer or \"auto\"");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", "/nonexistent/ds.json"});
      },
      "--deepspeed '/nonexistent/ds.json' cannot be read");
}

TEST_CASE("unknown and ignored ds keys are warned about, never dropped silently", "[config]") {
  std::vector<std::string> report;
  ResolveOptions ro;
  ro.report = &report;
  resolve_args(
      {"--deepspeed", write_ds("unknown", R"({"bf16": {"enabled": true}, "my_custom_key": 1,
                  "prescale_gradients": true, "csv_monitor": {"enabled": true}})")},
      ro);
  CHECK(has_line(report, "warning: my_custom_key: unknown to fsdp-train; ignored"));
  CHECK(has_line(report, "warning: prescale_gradients: ignored"));
  CHECK(has_line(report, "warning: csv_monitor: CSV output is not produced"));
}
