// A table of bad flags and bad configurations: each one stops with a UsageError (exit code 2 in
// the app) whose text names the flag or key to change.
#include "config/train_config.h"
#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::kRequiredFlags;
using fsdp::config::test::require_refused;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;

TEST_CASE("bad values are rejected with the flag and what is wrong", "[config]") {
  struct Case {
    std::vector<std::string> flags;
    int world;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--learning-rate", "fast"}, 1, "--learning-rate: 'fast' is not a number"},
      {{"--num-epochs", "2.5"}, 1, "--num-epochs: '2.5' is not an integer"},
      {{"--num-epochs", "0"}, 1, "--num-epochs must be positive"},
      {{"--sharding-strategy", "zero3"},
       1,
       "'zero3' is not one of full_shard, shard_grad_op, no_shard, hybrid_shard"},
      {{"--mixed-precision", "fp16"}, 1, "--mixed-precision: 'fp16' is not one of bf16, fp32"},
      {{"--report-to", "mlfow"},
       1,
       "'mlfow' is not one of jsonl, tensorboard, wandb, mlflow, none"},
      {{"--report-to", "none", "wandb"}, 1, "'none' cannot be combined with wandb"},
      {{"--cpu-offload=maybe"}, 1, "--cpu-offload: 'maybe' is not a boolean"},
      {{"--draft-global-batch-size", "16", "--draft-micro-batch-size", "3"},
       1,
       "--draft-global-batch-size 16 is not a multiple of --draft-micro-batch-size 3"},
      {{"--draft-global-batch-size", "16"}, 3, "x 3 data-parallel ranks = 3"},
      {{"--draft-global-batch-size", "0"}, 1, "--draft-global-batch-size must be positive"},
      {{"--gradient-accumulation-steps", "4"},
       2,
       "--gradient-accumulation-steps 4 disagrees with --draft-global-batch-size 16"},
      {{"--learning-rate", "2"}, 1, "--learning-rate 2 is outside (0, 1)"},
      {{"--warmup-ratio", "1.5"}, 1, "--warmup-ratio 1.5 is outside [0, 1]"},
      {{"--max-grad-norm", "-1"}, 1, "--max-grad-norm -1 is negative"},
      {{"--max-steps", "20", "--total-steps", "10"}, 1, "--max-steps 20 is past --total-steps 10"},
      {{"--warmup-steps", "50", "--total-steps", "10"}, 1, "--warmup-steps 50 exceeds"},
      {{"--adam-beta2", "1"}, 1, "--adam-beta2 1 is outside [0, 1)"},
      {{"--log-steps", "0"}, 1, "--log-steps must be positive"},
      {{"--keep-last", "-2"}, 1, "--keep-last must be 0 or more"},
      {{"--dist-timeout", "0"}, 1, "--dist-timeout must be positive"},
      {{"--mfu-peak-tflops", "-5"}, 1, "--mfu-peak-tflops -5 must be positive"},
      {{"--log-level", "loud"}, 1, "--log-level 'loud' is not one of"},
      {{"--ttt-length", "0"}, 1, "--ttt-length must be positive"},
      {{"--output-dir", ""}, 1, "--output-dir is required for training"},
      {{"--train-hidden-states-path", ""}, 1, "--train-hidden-states-path is required"},
      {{"--target-model-path", ""}, 1, "--target-model-path is required"},
      {{"--draft-model-config", ""}, 1, "--draft-model-config is required"},
      {{"--eval-only"}, 1, "--eval-only has no weights to evaluate"},
      {{"--mixed-precision", "fp32", "--reduce-dtype", "bf16"},
       1,
       "--reduce-dtype bf16 with --mixed-precision fp32"},
      {{"--resume", "auto", "--output-dir", ""}, 1, "--output-dir is required"},
  };
  for (const auto& c : cases) require_refused(c.flags, c.needle, c.world);
}

TEST_CASE("the good base configuration passes validation", "[config]") {
  const TrainConfig c = resolve_args(kRequiredFlags);
  ValidateOptions vo;
  vo.check_paths = false;
  for (int world : {1, 2, 4, 8, 16}) CHECK_NOTHROW(validate(c, world, vo));
  const BatchPlan p = batch_plan(c, 4);
  CHECK(p.accumulation_steps == 4);
  CHECK(batch_plan(c, 16).accumulation_steps == 1);
}

TEST_CASE("paths and model files are checked and named", "[config]") {
  using fsdp::config::test::write_file;
  const std::string dir = fsdp::config::test::scratch_dir("paths");
  REQUIRE(std::system(("mkdir -p '" + dir + "/target' '" + dir + "/hs'").c_str()) == 0);
  write_file(dir + "/draft.json",
             R"({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
                 "vocab_size": 512, "draft_vocab_size": 256})");
  write_file(dir + "/target/config.json", R"({"hidden_size": 64, "vocab_size": 512})");
  std::vector<std::string> good = {
      "--target-model-path",        dir + "/target", "--draft-model-config", dir + "/draft.json",
      "--train-hidden-states-path", dir + "/hs",     "--output-dir",         dir + "/out"};
  CHECK_NOTHROW(validate(resolve_args(good), 1));
  auto with = [&](const std::string& flag, const std::string& value) {
    std::vector<std::string> a = good;
    a.push_back(flag);
    a.push_back(value);
    return resolve_args(a);
  };
  require_usage_error([&] { validate(with("--target-model-path", dir + "/nope"), 1); },
                      "--target-model-path '" + dir + "/nope' is not a directory");
  require_usage_error([&] { validate(with("--draft-model-config", dir + "/target"), 1); },
                      "--draft-model-config '" + dir + "/target' is not a file");
  require_usage_error([&] { validate(with("--train-data-path", dir + "/x.jsonl"), 1); },
                      "--train-data-path");
  require_usage_error([&] { validate(with("--resume", dir + "/ckpt"), 1); },
                      "--resume '" + dir + "/ckpt' is not a directory");
  require_usage_error([&] { validate(with("--output-dir", dir + "/draft.json"), 1); }, "is a file");
  require_usage_error([&] { validate(with("--target-model-path", dir + "/hs"), 1); },
                      "has no config.json");

  // Sizes that must agree between the draft config and the target.
  write_file(dir + "/target/config.json", R"({"hidden_size": 64, "vocab_size": 1000})");
  require_usage_error([&] { validate(resolve_args(good), 1); },
                      "--draft-model-config vocab_size 512 differs from the target's "
                      "vocab_size 1000");
  write_file(dir + "/target/config.json", R"({"text_config": {"hidden_size": 128,
                                                "vocab_size": 512}})");
  require_usage_error([&] { validate(resolve_args(good), 1); },
                      "expects target hidden size 64 (target_hidden_size, else hidden_size) but "
                      "the target has 128");
  write_file(dir + "/draft.json",
             R"({"hidden_size": 64, "target_hidden_size": 128, "vocab_size": 512})");
  CHECK_NOTHROW(validate(resolve_args(good), 1));
  write_file(dir + "/draft.json", R"({"hidden_size": 64, "vocab_size": 512,
                                      "draft_vocab_size": 600})");
  write_file(dir + "/target/config.json", R"({"hidden_size": 64, "vocab_size": 512})");
  require_usage_error([&] { validate(resolve_args(good), 1); },
                      "draft_vocab_size 600 is not in 1..vocab_size 512");
  write_file(dir + "/draft.json", "{ broken");
  require_usage_error([&] { validate(resolve_args(good), 1); }, "is not valid JSON");
}

TEST_CASE("hybrid sharding needs equal ranks per node", "[config]") {
  TrainConfig c = resolve_args(kRequiredFlags);
  c.shard.strategy = ShardingStrategy::kHybridShard;
  c.loop.draft_global_batch_size = 12;
  ValidateOptions vo;
  vo.check_paths = false;
  CHECK_NOTHROW(validate(c, 4, vo, 2));
  require_usage_error([&] { validate(c, 3, vo, 2); }, "hybrid_shard needs the same number");
}
