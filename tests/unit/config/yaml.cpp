// YAML run files: round trip of the effective configuration, flags over YAML, and the errors for
// unknown keys (with the closest known key), duplicates, wrong shapes and syntax.
#include "config_test_util.h"
#include "support/test_paths.h"

using namespace fsdp::config;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;
using fsdp::config::test::scratch_dir;
using fsdp::config::test::write_file;

TEST_CASE("the saved YAML reads back to the same configuration", "[config]") {
  TrainConfig c = resolve_args({"--target-model-path",
                                "/models/llama 3",
                                "--learning-rate",
                                "3.5e-5",
                                "--adam-eps",
                                "1e-08",
                                "--report-to",
                                "tensorboard",
                                "wandb",
                                "--total-steps",
                                "1234",
                                "--sharding-strategy",
                                "shard_grad_op",
                                "--cpu-offload",
                                "--chat-template",
                                "llama3",
                                "--resume",
                                "/ckpt/epoch_1_step_5",
                                "--wandb-name",
                                "true",
                                "--mfu-peak-tflops",
                                "312.5",
                                "--lm-head-key",
                                "a: b # c"});
  const std::string yaml = to_yaml(c);
  TrainConfig back;
  apply_yaml_text(yaml, "saved.yaml", &back);
  CHECK(to_json(back) == to_json(c));
  CHECK(back.optim.adam_eps == 1e-8);
  CHECK(back.optim.learning_rate == 3.5e-5);
  CHECK(back.metrics.wandb_name == "true");
  CHECK(back.model.lm_head_key == "a: b # c");
  CHECK(back.checkpoint.resume_path == "/ckpt/epoch_1_step_5");
  CHECK_FALSE(back.loop.max_steps.has_value());
  // Defaults round-trip too (optional values as null).
  TrainConfig d, d2;
  apply_yaml_text(to_yaml(d), "defaults.yaml", &d2);
  CHECK(to_json(d2) == to_json(d));
}

TEST_CASE("flags override the YAML file; dashed keys are accepted", "[config]") {
  const std::string dir = scratch_dir("yaml_override");
  write_file(dir + "/run.yaml",
             "learning_rate: 2.0e-4\n"
             "draft-global-batch-size: 32\n"
             "num_epochs: 3\n"
             "report_to: [tensorboard]\n"
             "total_steps: null\n"
             "cpu_offload: yes\n");
  const TrainConfig c =
      resolve_args({"--config", dir + "/run.yaml", "--num-epochs", "5", "--report-to", "wandb"});
  CHECK(c.optim.learning_rate == 2e-4);
  CHECK(c.loop.draft_global_batch_size == 32);
  CHECK(c.loop.num_epochs == 5);
  CHECK(c.metrics.report_to == std::vector<MetricSink>{MetricSink::kWandb});
  CHECK(c.shard.cpu_offload);
  CHECK(c.config_file == dir + "/run.yaml");
}

TEST_CASE("bad YAML files stop with the file, line and what to do", "[config]") {
  TrainConfig c;
  require_usage_error([&] { apply_yaml_text("lerning_rate: 1e-4\n", "run.yaml", &c); },
                      "run.yaml:1: unknown key 'lerning_rate' | did you mean 'learning_rate'?");
  require_usage_error(
      [&] { apply_yaml_text("seed: 1\ndraft_micro_batchsize: 2\n", "run.yaml", &c); },
      "run.yaml:2: unknown key 'draft_micro_batchsize' | did you mean 'draft_micro_batch_size'?");
  require_usage_error([&] { apply_yaml_text("max_length: 10\nmax-length: 20\n", "run.yaml", &c); },
                      "'max-length' is given twice");
  require_usage_error([&] { apply_yaml_text("seed: [1, 2]\n", "run.yaml", &c); },
                      "run.yaml:1 seed: expected a single value, got a list");
  require_usage_error([&] { apply_yaml_text("hyperparameters:\n  lr: 1\n", "run.yaml", &c); },
                      "unknown key 'hyperparameters'");
  require_usage_error([&] { apply_yaml_text("optimizer:\n  lr: 1\n", "run.yaml", &c); },
                      "run.yaml:1 optimizer: expected a single value, got a mapping");
  require_usage_error([&] { apply_yaml_text("seed: 1\n  bad: [\n", "run.yaml", &c); },
                      "YAML syntax error");
  require_usage_error([&] { apply_yaml_text("- a\n- b\n", "run.yaml", &c); },
                      "the top level must be a mapping");
  require_usage_error([&] { apply_yaml_text("wandb_key: abc\n", "run.yaml", &c); },
                      "may not be written in a configuration file");
  require_usage_error([&] { apply_yaml_text("config: other.yaml\n", "run.yaml", &c); },
                      "command-line-only option");
  require_usage_error([&] { apply_yaml_text("num_epochs: many\n", "run.yaml", &c); },
                      "run.yaml:1 num_epochs: 'many' is not an integer");
  require_usage_error(
      [&] {
        resolve_args({"--config", "/nonexistent/run.yaml"});
      },
      "--config '/nonexistent/run.yaml' cannot be read");
  // An empty file sets nothing.
  CHECK(apply_yaml_text("", "empty.yaml", &c).empty());
}

TEST_CASE("the shipped run configs load and validate their batch arithmetic", "[config]") {
  for (const char* name : {"quickstart", "llama3-8b-eagle3", "gpt-oss-120b-eagle3"}) {
    INFO(name);
    const std::string path = std::string(FSDP_SOURCE_DIR) + "/configs/runs/" + name + ".yaml";
    const TrainConfig c = resolve_args({"--config", path});
    ValidateOptions vo;
    vo.check_paths = false;
    CHECK_NOTHROW(validate(c, name == std::string("quickstart") ? 2 : 4, vo));
    CHECK_FALSE(c.model.draft_model_config.empty());
  }
}

TEST_CASE("YAML resume: an empty value means no resume; sections get a flat-file hint",
          "[config]") {
  TrainConfig cfg;
  apply_yaml_text("resume:\n", "t.yaml", &cfg);
  CHECK(cfg.checkpoint.resume == ResumeMode::kNone);
  apply_yaml_text("resume: auto\n", "t.yaml", &cfg);
  CHECK(cfg.checkpoint.resume == ResumeMode::kAuto);
  CHECK_THROWS_WITH(apply_yaml_text("hyperparameters:\n  lr: 1e-4\n", "t.yaml", &cfg),
                    Catch::Contains("holding a section"));
}
