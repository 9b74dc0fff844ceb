// The option table and the command line: every row is complete and unique, the spellings map to
// the same option, and CLI11 input lands in the typed TrainConfig with SpecForge's defaults.
#include <set>

#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::parse_args;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;

TEST_CASE("every option row is complete and names are unique", "[config]") {
  std::set<std::string> names, keys;
  for (const auto& spec : option_table()) {
    INFO(spec.name);
    CHECK(names.insert(spec.name).second);
    CHECK(keys.insert(spec.yaml_key()).second);
    CHECK_FALSE(spec.group.empty());
    CHECK(spec.help.size() > 10);
    CHECK(spec.set);
    CHECK(spec.get);
    CHECK(spec.yaml_key().find('-') == std::string::npos);
    CHECK_FALSE(spec.default_text().empty());
  }
  CHECK(names.size() > 50);
}

TEST_CASE("SpecForge flags of reference §8 exist with SpecForge's defaults", "[config]") {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"target-model-path", "\"\""},
      {"draft-model-config", "\"\""},
      {"embedding-key", "model.embed_tokens.weight"},
      {"lm-head-key", "lm_head.weight"},
      {"train-data-path", "\"\""},
      {"train-hidden-states-path", "\"\""},
      {"eval-data-path", "\"\""},
      {"eval-hidden-states-path", "\"\""},
      {"num-epochs", "10"},
      {"draft-global-batch-size", "16"},
      {"draft-micro-batch-size", "1"},
      {"learning-rate", "0.0001"},
      {"max-length", "2048"},
      {"warmup-ratio", "0.015"},
      {"total-steps", "none"},
      {"max-grad-norm", "0.5"},
      {"log-steps", "50"},
      {"ttt-length", "7"},
      {"chat-template", "\"\""},
      {"cache-dir", "./cache"},
      {"output-dir", "\"\""},
      {"eval-interval", "1"},
      {"save-interval", "1"},
      {"seed", "0"},
      {"dist-timeout", "20"},
      {"resume", "none"},
      {"report-to", "none"},
      {"wandb-project", "\"\""},
      {"wandb-name", "\"\""},
      // fsdp-train's own
      {"sharding-strategy", "full_shard"},
      {"mixed-precision", "bf16"},
      {"reduce-dtype", "fp32"},
      {"cpu-offload", "false"},
      {"loss-normalization", "batch"},
      {"device", "auto"}};
  for (const auto& [name, def] : expected) {
    INFO(name);
    const OptionSpec* spec = find_option(name);
    REQUIRE(spec != nullptr);
    CHECK(spec->default_text() == def);
  }
  for (const char* unused : {"train-data-path", "eval-data-path", "chat-template"}) {
    CHECK(find_option(unused)->help.find("unused") != std::string::npos);
  }
}

TEST_CASE("flag, YAML and dashed spellings find the same option", "[config]") {
  const OptionSpec* a = find_option("--draft-micro-batch-size");
  REQUIRE(a != nullptr);
  CHECK(find_option("draft_micro_batch_size") == a);
  CHECK(find_option("draft-micro-batch-size") == a);
  CHECK(find_option("nonsense-option") == nullptr);
  CHECK(closest_option("lerning_rate") == "learning-rate");
  CHECK(closest_option("draft-micro-batchsize") == "draft-micro-batch-size");
}

TEST_CASE("command line values reach the typed config", "[config]") {
  const TrainConfig c = resolve_args({"--target-model-path",
                                      "/t",
                                      "--draft-model-config",
                                      "d.json",
                                      "--learning-rate",
                                      "3e-4",
                                      "--draft-global-batch-size",
                                      "32",
                                      "--total-steps",
                                      "100",
                                      "--sharding-strategy",
                                      "hybrid_shard",
                                      "--mixed-precision",
                                      "fp32",
                                      "--cpu-offload",
                                      "--report-to",
                                      "wandb",
                                      "tensorboard",
                                      "--resume",
                                      "--wandb-key",
                                      "sekret",
                                      "--mfu-peak-tflops",
                                      "989",
                                      "--loss-normalization",
                                      "tokens",
                                      "--max-steps",
                                      "7"});
  CHECK(c.model.target_model_path == "/t");
  CHECK(c.model.draft_model_config == "d.json");
  CHECK(c.optim.learning_rate == 3e-4);
  CHECK(c.loop.draft_global_batch_size == 32);
  CHECK(c.loop.total_steps == 100);
  CHECK(c.loop.max_steps == 7);
  CHECK(c.shard.strategy == ShardingStrategy::kHybridShard);
  CHECK(c.shard.mixed_precision == Precision::kFP32);
  CHECK(c.shard.cpu_offload);
  CHECK(c.metrics.report_to ==
        std::vector<MetricSink>{MetricSink::kWandb, MetricSink::kTensorBoard});
  CHECK(c.reports_to(MetricSink::kWandb));
  CHECK(c.checkpoint.resume == ResumeMode::kAuto);
  CHECK(c.metrics.wandb_key == "sekret");
  CHECK(c.metrics.mfu_peak_tflops == 989.0);
  CHECK(c.loop.loss_normalization == LossNormalization::kTokens);
}

TEST_CASE("resume takes auto, none or a path; booleans take =false", "[config]") {
  CHECK(resolve_args({"--resume", "none"}).checkpoint.resume == ResumeMode::kNone);
  CHECK(resolve_args({"--resume", "auto"}).checkpoint.resume == ResumeMode::kAuto);
  const TrainConfig p = resolve_args({"--resume", "out/epoch_0_step_10"});
  CHECK(p.checkpoint.resume == ResumeMode::kPath);
  CHECK(p.checkpoint.resume_path == "out/epoch_0_step_10");
  CHECK_FALSE(resolve_args({"--cpu-offload=false"}).shard.cpu_offload);
  CHECK(resolve_args({"--cpu-offload=true"}).shard.cpu_offload);
  CHECK(resolve_args({"--report-to", "none"}).metrics.report_to.empty());
  CHECK(resolve_args({"--report-to", "jsonl,tensorboard"}).metrics.report_to ==
        std::vector<MetricSink>{MetricSink::kTensorBoard});
  // Several trackers at once, duplicates dropped; MLflow's flags land in the metrics section.
  const TrainConfig m = resolve_args({"--report-to", "wandb,tensorboard,MLflow,mlflow",
                                      "--mlflow-tracking-uri", "file:///tmp/mlruns",
                                      "--mlflow-experiment-name", "e", "--mlflow-run-name", "r"});
  CHECK(m.metrics.report_to ==
        std::vector<MetricSink>{MetricSink::kWandb, MetricSink::kTensorBoard, MetricSink::kMlflow});
  CHECK(m.metrics.mlflow_tracking_uri == "file:///tmp/mlruns");
  CHECK(m.metrics.mlflow_experiment_name == "e");
  CHECK(m.metrics.mlflow_run_name == "r");
}

TEST_CASE("secret and command-line-only options never reach saved configs", "[config]") {
  const TrainConfig c =
      resolve_args({"--report-to", "wandb", "--wandb-key", "abc123secret", "--wandb-project", "p"});
  CHECK(to_yaml(c).find("abc123secret") == std::string::npos);
  CHECK(to_json(c).find("abc123secret") == std::string::npos);
  CHECK(to_display(c).find("abc123secret") == std::string::npos);
  CHECK(to_json(c).find("wandb_key") == std::string::npos);
  CHECK(to_yaml(c).find("wandb_project: \"p\"") != std::string::npos);
}

TEST_CASE("an app that already has --log-level keeps its own", "[config]") {
  CLI::App app{"test"};
  std::string level;
  app.add_option("--log-level", level, "root option");
  TrainOptionsBinding binding;
  add_train_options(app, &binding);
  const char* argv[] = {"x", "--log-level", "debug", "--seed", "5"};
  app.parse(5, const_cast<char**>(argv));
  const CommandLineValues v = binding.values();
  CHECK(level == "debug");
  CHECK(v.given.count("log-level") == 0);
  CHECK(v.given.at("seed").text == "5");
}

TEST_CASE("--help lists every option with its group and default", "[config]") {
  CLI::App app{"test"};
  TrainOptionsBinding binding;
  add_train_options(app, &binding);
  const std::string help = app.help();
  for (const auto& spec : option_table()) {
    INFO(spec.name);
    CHECK(help.find(spec.flag()) != std::string::npos);
  }
  CHECK(help.find("Sharding") != std::string::npos);
  CHECK(help.find("[default: 16]") != std::string::npos);
}

TEST_CASE("--lora-targets is parsed once into the draft's projections", "[config]") {
  using fsdp::model::LoraTarget;
  CHECK(TrainConfig{}.model.lora_targets == fsdp::model::all_lora_targets());
  CHECK(resolve_args(
            {"--lora-rank", "4", "--lora-targets", "Q_proj,down_proj", "--lora-targets", "q_proj"})
            .model.lora_targets ==
        std::vector<LoraTarget>{LoraTarget::kQProj, LoraTarget::kDownProj});
  CHECK(option("lora-targets")
            .get(resolve_args({"--lora-rank", "4", "--lora-targets", "v_proj"}))
            .list == std::vector<std::string>{"v_proj"});
  require_usage_error(
      [] {
        resolve_args({"--lora-rank", "4", "--lora-targets", "qkv_proj"});
      },
      "qkv_proj");
  require_usage_error(
      [] {
        resolve_args({"--lora-rank", "4", "--lora-targets", "qkv_proj"});
      },
      "--lora-targets");
}
