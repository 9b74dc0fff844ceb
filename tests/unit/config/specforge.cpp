// Flags of other SpecForge versions: aliases land in our options (and may not contradict them),
// the per-rank batch model derives the global batch, flags without effect are checked and
// recorded, the ones fsdp-train cannot honour are refused, and unknown flags get advice.
#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;

namespace {
ResolveOptions world(int n) {
  ResolveOptions o;
  o.world_size = n;
  return o;
}
}  // namespace

TEST_CASE("SpecForge aliases set our options", "[config]") {
  const TrainConfig c =
      resolve_args({"--batch-size", "3", "--log-interval", "7", "--max-num-steps", "9",
                    "--ckpt-dir", "/some/draft", "--draft-accumulation-steps", "2",
                    "--dataloader-num-workers", "6", "--wandb", "--verbose"});
  CHECK(c.loop.draft_micro_batch_size == 3);
  CHECK(c.metrics.log_steps == 7);
  CHECK(c.loop.max_steps == 9);
  CHECK(c.model.init_checkpoint == "/some/draft");
  CHECK(c.loop.gradient_accumulation_steps == 2);
  CHECK(c.data.loader_threads == 6);
  CHECK(c.metrics.report_to == std::vector<MetricSink>{MetricSink::kWandb});
  CHECK(c.runtime.log_level == fsdp::log::Level::kDebug);
  // SpecForge's 0 workers (load in the main process) is one reader thread here.
  CHECK(resolve_args({"--dataloader-num-workers", "0"}).data.loader_threads == 1);
  CHECK(resolve_args({"--wandb=false"}).metrics.report_to.empty());
  // Aliases are command-line spellings: the saved configuration uses our names only.
  CHECK(to_yaml(c).find("\nbatch_size:") == std::string::npos);
  CHECK(to_yaml(c).find("draft_micro_batch_size: 3") != std::string::npos);
  CHECK(to_yaml(c).find("log_interval") == std::string::npos);
  CHECK(to_json(c).find("\"log_steps\": 7") != std::string::npos);
}

TEST_CASE("SpecForge's per-rank batch gives the global batch", "[config]") {
  // batch-size x ranks x accumulation, as SpecForge's data loaders do.
  CHECK(resolve_args({"--batch-size", "2"}, world(4)).loop.draft_global_batch_size == 8);
  const TrainConfig c =
      resolve_args({"--batch-size", "2", "--draft-accumulation-steps", "3"}, world(4));
  CHECK(c.loop.draft_global_batch_size == 24);
  CHECK(batch_plan(c, 4).accumulation_steps == 3);
  CHECK(resolve_args({"--draft-accumulation-steps", "4"}, world(2)).loop.draft_global_batch_size ==
        8);
  // An explicit global batch wins; the plan then checks the arithmetic as usual.
  const TrainConfig g =
      resolve_args({"--batch-size", "2", "--draft-global-batch-size", "16"}, world(4));
  CHECK(g.loop.draft_global_batch_size == 16);
  CHECK(batch_plan(g, 4).accumulation_steps == 2);
  // Our own flags keep the model of docs/reference.md §6 (global 16 by default).
  CHECK(resolve_args({"--draft-micro-batch-size", "2"}, world(4)).loop.draft_global_batch_size ==
        16);
  // Unknown world size (not the binary): nothing is derived.
  CHECK(resolve_args({"--batch-size", "2"}).loop.draft_global_batch_size == 16);
}

TEST_CASE("an alias and its option may not disagree", "[config]") {
  require_usage_error(
      [] {
        resolve_args({"--log-interval", "10", "--log-steps", "20"});
      },
      "disagree");
  require_usage_error(
      [] {
        resolve_args({"--batch-size", "2", "--draft-micro-batch-size", "4"});
      },
      "keep one");
  require_usage_error(
      [] {
        resolve_args({"--wandb", "--report-to", "tensorboard"});
      },
      "--report-to");
  CHECK(resolve_args({"--log-interval", "10", "--log-steps", "10"}).metrics.log_steps == 10);
  CHECK(resolve_args({"--wandb", "--report-to", "wandb"}).metrics.report_to.size() == 1);
}

TEST_CASE("SpecForge flags without effect are checked and recorded", "[config]") {
  const TrainConfig c =
      resolve_args({"--tp-size", "1", "--cache-key", "k1", "--attention-backend", "SDPA",
                    "--build-dataset-num-proc", "8", "--is-preformatted", "--sp-ring-size", "1",
                    "--target-model-backend", "sglang", "--model-download-dir", "/hf"});
  const std::map<std::string, std::string> want = {{"attention-backend", "SDPA"},
                                                   {"build-dataset-num-proc", "8"},
                                                   {"cache-key", "k1"},
                                                   {"is-preformatted", "true"},
                                                   {"model-download-dir", "/hf"},
                                                   {"sp-ring-size", "1"},
                                                   {"target-model-backend", "sglang"},
                                                   {"tp-size", "1"}};
  CHECK(c.specforge_flags == want);
  CHECK(to_json(c).find("\"specforge_flags\"") != std::string::npos);
  CHECK(to_json(c).find("\"cache-key\": \"k1\"") != std::string::npos);
  CHECK(to_display(c).find("--tp-size 1") != std::string::npos);
  // The saved YAML lists them in a comment and still reads back.
  const std::string yaml = to_yaml(c);
  CHECK(yaml.find("# SpecForge flags given (no effect):") != std::string::npos);
  TrainConfig back;
  apply_yaml_text(yaml, "saved.yaml", &back);
  CHECK(back.specforge_flags.empty());
  CHECK(to_yaml(back).find("SpecForge flags") == std::string::npos);
}

TEST_CASE("SpecForge flags fsdp-train cannot honour are refused with the reason", "[config]") {
  require_usage_error([] { resolve_args({"--tp-size", "2"}); }, "nothing to split");
  require_usage_error([] { resolve_args({"--sp-ring-size", "4"}); }, "ring attention");
  // Ulysses is fsdp-train's sequence parallelism; SpecForge's usp backend is recorded.
  CHECK(resolve_args({"--sp-ulysses-size", "2"}).loop.sp_ulysses_size == 2);
  CHECK(resolve_args({"--attention-backend", "usp"}).specforge_flags.at("attention-backend") ==
        "usp");
  require_usage_error(
      [] {
        resolve_args({"--draft-attention-backend", "xformers"});
      },
      "not one of sdpa, flex_attention, fa, eager");
  require_usage_error([] { resolve_args({"--is-vlm"}); }, "vision-language");
  require_usage_error(
      [] {
        resolve_args({"--target-model-backend", "vllm"});
      },
      "sglang, hf, custom");
  require_usage_error([] { resolve_args({"--build-dataset-num-proc", "0"}); }, "positive");
  require_usage_error([] { resolve_args({"--dataloader-num-workers", "-1"}); }, "0 or more");
  require_usage_error([] { resolve_args({"--tp-size", "one"}); }, "--tp-size");
  require_usage_error(
      [] {
        resolve_args({"--report-to", "swanlab"});
      },
      "SwanLab tracker is not supported");
  // --dp-size must be the job's data-parallel size.
  ValidateOptions vo;
  vo.check_paths = false;
  vo.training = false;
  TrainConfig c = resolve_args({"--dp-size", "4", "--target-model-path", "t",
                                "--draft-model-config", "d", "--draft-global-batch-size", "8"});
  CHECK_NOTHROW(validate(c, 4, vo));
  require_usage_error([&] { validate(c, 2, vo); }, "2 data-parallel ranks");
}

TEST_CASE("profile options are validated", "[config]") {
  ValidateOptions vo;
  vo.check_paths = false;
  vo.training = false;
  const std::vector<std::string> base = {"--target-model-path", "t", "--draft-model-config", "d"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return resolve_args(a);
  };
  const TrainConfig p = with({"--profile", "--profile-start-step", "0", "--profile-num-steps", "2",
                              "--profile-record-shapes", "--profile-dir", "/tmp/p"});
  CHECK(p.profile.enabled);
  CHECK(p.profile.start_step == 0);
  CHECK(p.profile.num_steps == 2);
  CHECK(p.profile.record_shapes);
  CHECK(p.profile.dir == "/tmp/p");
  CHECK_NOTHROW(validate(p, 1, vo));
  require_usage_error(
      [&] {
        validate(with({"--profile", "--profile-num-steps", "0"}), 1, vo);
      },
      "--profile-num-steps");
  require_usage_error(
      [&] {
        validate(with({"--profile", "--profile-start-step", "-1"}), 1, vo);
      },
      "--profile-start-step");
  require_usage_error(
      [&] {
        validate(with({"--loader-threads", "65"}), 1, vo);
      },
      "--loader-threads");
}

TEST_CASE("unknown flags get a reason or the closest flag", "[config]") {
  auto text = [](const std::string& arg) {
    const auto a = advise_unknown_flag(arg);
    return a.message + " | " + a.hint;
  };
  CHECK(text("--swanlab-project").find("SwanLab tracker is not supported") != std::string::npos);
  // MLflow is supported: a misspelt MLflow flag gets the closest one.
  CHECK(text("--mlflow-run=x").find("did you mean --mlflow-run-name?") != std::string::npos);
  CHECK(text("--sglang-mem-fraction-static").find("online target model") != std::string::npos);
  CHECK(text("--target-batch-size").find("online target model") != std::string::npos);
  CHECK(text("--learnin-rate=3").find("unknown flag --learnin-rate |") != std::string::npos);
  CHECK(text("--learnin-rate=3").find("did you mean --learning-rate?") != std::string::npos);
  CHECK(text("stray").find("unexpected argument 'stray'") != std::string::npos);
}
