// SpecForge's typed run configuration (`specforge train -c run.yaml section.key=value`): every
// example offline EAGLE3 config of SpecForge loads (tests/data/specforge_configs), the keys that
// take effect get SpecForge's defaults and map onto the option table, overrides work as
// SpecForge's apply_overrides does, and unknown, refused and inconsistent keys are errors naming
// the key.
#include <dirent.h>

#include <fstream>
#include <sstream>

#include "compat/config_file.h"
#include "compat/specforge_schema.h"
#include "config_test_util.h"
#include "support/generated_doc.h"
#include "support/test_paths.h"

using namespace fsdp::config;
using fsdp::config::test::parse_args;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::scratch_dir;
using fsdp::config::test::write_file;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fill(std::string text) {
  const std::vector<std::pair<std::string, std::string>> subs = {
      {"@TARGET@", "/t"},   {"@DRAFT@", "/d.json"}, {"@VOCAB@", "/v.pt"},
      {"@FEATURES@", "/h"}, {"@CACHE@", "/c"},      {"@OUT@", "/o"}};
  for (const auto& [from, to] : subs) {
    for (size_t p = text.find(from); p != std::string::npos; p = text.find(from, p))
      text.replace(p, from.size(), to);
  }
  return text;
}

ConfigFileLoad load(const std::string& text, TrainConfig* cfg,
                    const std::vector<std::string>& overrides = {}, int world = 0) {
  return load_config_text(text, "run.yaml", overrides, cfg, world);
}

const char* const kMinimal = R"(model:
  target_model_path: /t
data:
  hidden_states_path: /h
)";

// kMinimal with `extra`'s sections added; a model: or data: section of `extra` joins
// kMinimal's (a YAML file may not repeat a section).
std::string with(const std::string& extra) {
  std::string model = "model:\n  target_model_path: /t\n",
              data = "data:\n  hidden_states_path: /h\n";
  std::string rest;
  std::string* into = &rest;
  std::istringstream in(extra);
  for (std::string line; std::getline(in, line);) {
    if (line == "model:") {
      into = &model;
      continue;
    }
    if (line == "data:") {
      into = &data;
      continue;
    }
    if (!line.empty() && line[0] != ' ') into = &rest;
    *into += line + "\n";
  }
  return model + data + rest;
}

}  // namespace

TEST_CASE("each of SpecForge's example offline EAGLE3 configs loads", "[config]") {
  const std::string dir = std::string(FSDP_SOURCE_DIR) + "/tests/data/specforge_configs";
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  int n = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 5 || name.substr(name.size() - 5) != ".yaml") continue;
    INFO(name);
    TrainConfig cfg;
    ConfigFileLoad r;
    REQUIRE_NOTHROW(r = load(fill(read(dir + "/" + name)), &cfg, {}, 1));
    CHECK(r.specforge_schema);
    CHECK(cfg.model.target_model_path == "/t");
    CHECK(cfg.model.draft_model_config == "/d.json");
    CHECK(cfg.model.vocab_mapping_path == "/v.pt");
    CHECK(cfg.data.train_hidden_states_path == "/h");
    CHECK(cfg.checkpoint.output_dir == "/o");
    // What every example sets: seed 0, ten epochs, a 20-minute timeout, TTT 7, saves every
    // 1000 (one: 5000) optimizer updates, SpecForge's ZeRO-2 default, no per-epoch saves.
    CHECK(cfg.loop.seed == 0);
    CHECK(cfg.loop.num_epochs == 10);
    CHECK(cfg.runtime.dist_timeout_minutes == 20);
    CHECK(cfg.model.ttt_length == 7);
    CHECK((cfg.checkpoint.save_steps == 1000 || cfg.checkpoint.save_steps == 5000));
    CHECK(cfg.checkpoint.save_interval == 0);
    CHECK(cfg.eval.eval_interval == 0);
    CHECK(cfg.loop.draft_micro_batch_size == 1);
    CHECK(cfg.shard.strategy == ShardingStrategy::kShardGradOp);
    CHECK(cfg.metrics.log_steps == 50);
    CHECK((cfg.optim.learning_rate == 1e-4 || cfg.optim.learning_rate == 5e-5));
    CHECK((cfg.data.max_length == 2048 || cfg.data.max_length == 4096));
    CHECK(cfg.model.auto_draft_config == AutoDraftConfig::kTarget);
    CHECK(cfg.metrics.wandb_name == name.substr(0, name.size() - 5));
    ++n;
  }
  closedir(d);
  CHECK(n == 9);
}

TEST_CASE("keys not in the file take SpecForge's defaults", "[config]") {
  TrainConfig cfg;
  const ConfigFileLoad r = load(kMinimal, &cfg);
  CHECK(r.specforge_schema);
  CHECK(cfg.loop.seed == 42);
  CHECK(cfg.loop.num_epochs == 1);
  CHECK(cfg.runtime.dist_timeout_minutes == 10);
  CHECK(cfg.optim.learning_rate == 1e-4);
  CHECK(cfg.optim.warmup_ratio == 0.015);
  CHECK(cfg.optim.max_grad_norm == 0.5);
  CHECK(cfg.optim.lr_scheduler == LrScheduler::kCosine);
  CHECK(cfg.model.ttt_length == 7);
  CHECK(cfg.data.max_length == 2048);
  CHECK(cfg.data.chat_template == "llama3");
  CHECK(cfg.data.cache_dir == "./cache");
  CHECK(cfg.checkpoint.output_dir == "./output");
  CHECK(cfg.checkpoint.save_steps == 0);
  CHECK(cfg.checkpoint.save_interval == 0);
  CHECK(cfg.checkpoint.save_final);
  CHECK(cfg.checkpoint.keep_last == 0);
  CHECK(cfg.eval.eval_steps == 0);
  CHECK(cfg.eval.eval_interval == 0);
  CHECK(cfg.metrics.log_steps == 50);
  CHECK(cfg.metrics.report_to.empty());
  CHECK(cfg.shard.strategy == ShardingStrategy::kShardGradOp);
  CHECK(cfg.loop.lk_loss_type == LkLossType::kNone);
  CHECK(cfg.loop.kl_scale == 1.0);
  CHECK(cfg.loop.kl_decay == 1.0);
  CHECK_FALSE(cfg.loop.total_steps.has_value());
  CHECK(cfg.profile.start_step == 30);
  CHECK(cfg.model.draft_init == DraftInit::kNormal);
  CHECK(cfg.model.auto_draft_config == AutoDraftConfig::kTarget);
  CHECK(cfg.metrics.wandb_name == "specforge-run");
  CHECK(cfg.metrics.mlflow_run_name == "specforge-run");
  // Only what the file gave counts as set (a ds_config may still fill the rest).
  CHECK(r.set_options == std::vector<std::string>{"target-model-path", "train-hidden-states-path"});
}

TEST_CASE("typed keys map onto the options", "[config]") {
  TrainConfig cfg;
  load(with(R"(training:
  batch_size: 2
  accumulation_steps: 4
  fsdp_sharding: FULL_SHARD
  lr_scheduler: constant
  optimizer_cpu_offload: true
  max_steps: 300
  eval_interval: 100
  max_checkpoints: 3
  lk_loss_type: lambda
  kl_decay: 3.0
  resume_from: file:///ckpt/epoch_0_step_100
tracking:
  report_to: mlflow
  mlflow_experiment_name: exp
  wandb_offline: yes
profiling:
  enabled: true
  num_steps: 2
data:
  eval_hidden_states_path: /e
  dataloader_num_workers: 2
model:
  draft_checkpoint_path: null
  lm_head_key: model.lm_head.weight
run_id: my-run
)"),
       &cfg);
  CHECK(cfg.loop.draft_micro_batch_size == 2);
  CHECK(cfg.loop.gradient_accumulation_steps == 4);
  CHECK(cfg.shard.strategy == ShardingStrategy::kFullShard);
  CHECK(cfg.optim.lr_scheduler == LrScheduler::kConstant);
  CHECK(cfg.shard.cpu_offload);
  CHECK(cfg.loop.max_steps == 300);
  // specforge train's LR horizon: max_steps when total_steps is not given.
  CHECK(cfg.loop.total_steps == 300);
  CHECK(cfg.eval.eval_steps == 100);
  CHECK(cfg.checkpoint.keep_last == 3);
  CHECK(cfg.loop.lk_loss_type == LkLossType::kLambda);
  CHECK(cfg.loop.kl_decay == 3.0);
  CHECK(cfg.checkpoint.resume == ResumeMode::kPath);
  CHECK(cfg.checkpoint.resume_path == "/ckpt/epoch_0_step_100");
  CHECK(cfg.metrics.report_to == std::vector<MetricSink>{MetricSink::kMlflow});
  CHECK(cfg.metrics.mlflow_experiment_name == "exp");
  CHECK(cfg.metrics.wandb_offline);
  CHECK(cfg.profile.enabled);
  CHECK(cfg.profile.num_steps == 2);
  CHECK(cfg.data.eval_hidden_states_path == "/e");
  CHECK(cfg.data.loader_threads == 2);
  CHECK(cfg.model.lm_head_key == "model.lm_head.weight");
  CHECK(cfg.metrics.mlflow_run_name == "my-run");
}

TEST_CASE("dotted overrides after the file, as specforge train -c takes them", "[config]") {
  TrainConfig cfg;
  load(with("training:\n  learning_rate: 1e-4\n  max_steps: 10\n"), &cfg,
       {"training.learning_rate=5e-5", "training.seed=7", "training.num_epochs=2.0",
        "tracking.wandb_offline=on", "model.aux_hidden_state_layer_ids=[2, 6, 10]",
        "training.max_steps=null", "training.learning_rate=3e-5", "output_dir=/elsewhere"});
  CHECK(cfg.optim.learning_rate == 3e-5);  // the last override wins
  CHECK(cfg.loop.seed == 7);
  CHECK(cfg.loop.num_epochs == 2);
  CHECK(cfg.metrics.wandb_offline);
  CHECK_FALSE(cfg.loop.max_steps.has_value());
  CHECK(cfg.checkpoint.output_dir == "/elsewhere");
  CHECK(cfg.specforge_flags.at("model.aux_hidden_state_layer_ids") == "[2, 6, 10]");

  TrainConfig c2;
  require_usage_error([&] { load(kMinimal, &c2, {"training.learnig_rate=1"}); },
                      "training.learning_rate");
  require_usage_error([&] { load(kMinimal, &c2, {"training.learning_rate"}); },
                      "section.key=value");
  require_usage_error([&] { load(kMinimal, &c2, {"training=1"}); }, "is a section");
  require_usage_error([&] { load(kMinimal, &c2, {"training.num_epochs=1.5"}); },
                      "training.num_epochs");
  require_usage_error([&] { load(kMinimal, &c2, {"training.num_epochs=0"}); }, "out of range");
  require_usage_error([&] { load(kMinimal, &c2, {"training.lr_scheduler=linear"}); },
                      "cosine, constant");
  require_usage_error([&] { load(kMinimal, &c2, {"tracking.wandb_offline=maybe"}); },
                      "wandb_offline");
}

TEST_CASE("overrides reach the typed file from the command line", "[config]") {
  const std::string dir = scratch_dir("specforge_cli");
  write_file(dir + "/run.yaml", with("training:\n  seed: 3\n"));
  const CommandLineValues v = parse_args({"-c", dir + "/run.yaml", "training.seed=5",
                                          "--learning-rate", "2e-5", "data.max_length=64"});
  CHECK(v.overrides == std::vector<std::string>{"training.seed=5", "data.max_length=64"});
  const TrainConfig cfg = resolve(v);
  CHECK(cfg.loop.seed == 5);
  CHECK(cfg.data.max_length == 64);
  CHECK(cfg.optim.learning_rate == 2e-5);  // flags come after the file
  // The per-rank batch of SpecForge: global = batch_size x ranks x accumulation_steps.
  ResolveOptions ro;
  ro.world_size = 4;
  const TrainConfig c4 = resolve(parse_args({"-c", dir + "/run.yaml", "training.batch_size=2",
                                             "training.accumulation_steps=3"}),
                                 ro);
  CHECK(c4.loop.draft_global_batch_size == 24);
  // A stray word and overrides without a typed file are refused.
  require_usage_error([&] { parse_args({"-c", dir + "/run.yaml", "oops"}); }, "oops");
  write_file(dir + "/flat.yaml", "learning_rate: 1e-4\n");
  require_usage_error(
      [&] {
        resolve(parse_args({"-c", dir + "/flat.yaml", "training.seed=1"}));
      },
      "typed schema");
  require_usage_error([&] { resolve(parse_args({"training.seed=1"})); }, "--config");
}

TEST_CASE("unknown keys are errors naming the key and the closest one", "[config]") {
  TrainConfig cfg;
  require_usage_error([&] { load(with("training:\n  learnig_rate: 1e-4\n"), &cfg); },
                      "training.learning_rate");
  require_usage_error([&] { load(with("training:\n  learnig_rate: 1e-4\n"), &cfg); }, "run.yaml:6");
  require_usage_error([&] { load(with("extra: 1\n"), &cfg); }, "unknown key 'extra'");
  require_usage_error([&] { load(with("training:\n  seed: 1\n  seed: 2\n"), &cfg); },
                      "given twice");
  require_usage_error([&] { load(with("model:\n  foo: 1\n"), &cfg); }, "model.foo");
  require_usage_error([&] { load(std::string(kMinimal) + "model:\n  cache_dir: /x\n", &cfg); },
                      "'model' is given twice");
  require_usage_error([&] { load(with("deployment:\n  trainer:\n    gpus: 2\n"), &cfg); },
                      "deployment.trainer.gpus");
  require_usage_error([&] { load("data:\n  hidden_states_path: /h\n", &cfg); },
                      "model.target_model_path is required");
  require_usage_error([&] { load(with("training: 3\n"), &cfg); }, "is a section");
  require_usage_error([&] { load(with("training:\n  seed: [1]\n"), &cfg); }, "single value");
  require_usage_error([&] { load(with("training:\n  seed: null\n"), &cfg); }, "null");
}

TEST_CASE("keys fsdp-train does not offer are refused with the reason", "[config]") {
  TrainConfig cfg;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"training:\n  strategy: peagle\n  norm_before_residual: true\n", "norm_before_residual"},
      {"training:\n  strategy: domino\n", "Domino"},
      {"training:\n  role: producer\n", "producer"},
      {"training:\n  attention_backend: eager\n", "eager"},
      {"training:\n  attention_backend: usp\n  sp_ring_size: 2\n", "ring attention"},
      {"training:\n  sp_ring_size: 2\n", "attention_backend=usp"},
      {"training:\n  tp_size: 2\n", "tensor parallelism"},
      {"tracking:\n  report_to: swanlab\n", "SwanLab"},
      {"tracking:\n  swanlab_project: p\n", "SwanLab"},
      {"model:\n  draft_num_hidden_layers: 2\n", "only 1"},
      {"model:\n  input_modality: image\n", "text"},
      {"model:\n  load_target_embedding: false\n", "embedding"},
      {"data:\n  eval_data_path: /x\n", "eval_data_path"},
      {"data:\n  eval_hidden_states_path: /e\n", "configured together"},
      {"training:\n  eval_interval: 10\n", "configured together"},
      {"training:\n  compact_teacher_chunk_size: 4\n", "compact_teacher=true"},
      {"model:\n  draft_checkpoint_path: /w\ntraining:\n  resume_from: /r\n", "mutually exclusive"},
      {"deployment:\n  mode: disaggregated\n", "deployment.disaggregated section"},
      {"deployment:\n  trainer:\n    nnodes: 2\n", "master_addr"},
      {"model:\n  torch_dtype: float16\ntraining:\n  fsdp_sharding: NO_SHARD\n", "float16"},
  };
  for (const auto& [extra, needle] : cases) {
    INFO(extra);
    require_usage_error([&] { load(with(extra), &cfg); }, needle);
  }
  // Online sources: the offline-only message.
  require_usage_error(
      [&] { load("model:\n  target_model_path: /t\ndata:\n  train_data_path: /j\n", &cfg); },
      "data.hidden_states_path");
  require_usage_error(
      [&] {
        load(
            "model:\n  target_model_path: /t\ndata:\n  prompts_path: /p\n  hidden_states_path: "
            "/h\n",
            &cfg);
      },
      "exactly one");
}

TEST_CASE("USP with sp_ulysses_size is fsdp-train's Ulysses sequence parallelism", "[config]") {
  TrainConfig cfg;
  load(with("training:\n  attention_backend: usp\n  sp_ulysses_size: 2\n  batch_size: 1\n"), &cfg);
  CHECK(cfg.loop.sp_ulysses_size == 2);
  CHECK(cfg.specforge_flags.at("attention-backend") == "usp");
  // SpecForge's own rules: usp needs batch_size 1 and a size above 1.
  require_usage_error(
      [&] {
        load(with("training:\n  attention_backend: usp\n  sp_ulysses_size: 2\n  batch_size: 2\n"),
             &cfg);
      },
      "batch_size=1");
  require_usage_error([&] { load(with("training:\n  attention_backend: usp\n"), &cfg); },
                      "sp_ulysses_size * sp_ring_size > 1");
}

TEST_CASE("recorded keys are listed at start-up, and SpecForge's topology is checked", "[config]") {
  TrainConfig cfg;
  const ConfigFileLoad r = load(with(R"(model:
  sglang_ep_size: 4
  trust_remote_code: true
training:
  lambda_base_start: 0.7
  compact_teacher: true
runtime:
  producer_lease: 16
deployment:
  trainer:
    nnodes: 1
    nproc_per_node: 8
)"),
                                &cfg, {}, /*world=*/2);
  std::string all;
  for (const auto& line : r.report) all += line + "\n";
  INFO(all);
  for (const char* key : {"model.sglang_ep_size = 4", "model.trust_remote_code = true",
                          "training.lambda_base_start = 0.7", "training.compact_teacher = true",
                          "runtime.producer_lease = 16"})
    CHECK(all.find(key) != std::string::npos);
  CHECK(all.find("asks for 8 rank(s)") != std::string::npos);
  CHECK(cfg.specforge_flags.at("training.lambda_base_start") == "0.7");
  // The model section's torch_dtype under FSDP: recorded, compute stays bf16.
  TrainConfig c2;
  load(with("model:\n  torch_dtype: float32\n"), &c2);
  CHECK(c2.shard.mixed_precision == Precision::kBF16);
  CHECK(c2.specforge_flags.at("model.torch_dtype") == "float32");
  TrainConfig c3;
  load(with("model:\n  torch_dtype: float32\ntraining:\n  fsdp_sharding: NO_SHARD\n"), &c3);
  CHECK(c3.shard.mixed_precision == Precision::kFP32);
  CHECK(c3.shard.strategy == ShardingStrategy::kNoShard);
}

TEST_CASE("disaggregated offline configs and the legacy keys load", "[config]") {
  TrainConfig cfg;
  const ConfigFileLoad r = load(with(R"(training:
  deployment_mode: disaggregated
deployment:
  disaggregated:
    control_dir: /o/control
    backend: shared_dir
    store_root: /o/features
)"),
                                &cfg);
  CHECK(r.specforge_schema);
  CHECK(cfg.data.train_hidden_states_path == "/h");
  TrainConfig c2;
  require_usage_error(
      [&] {
        load(with("deployment:\n  mode: disaggregated\n  disaggregated:\n    control_dir: /c\n    "
                  "backend: shared_dir\n"),
             &c2);
      },
      "store_root");
  require_usage_error(
      [&] {
        load(with("deployment:\n  mode: disaggregated\n  disaggregated:\n    backend: mooncake\n"),
             &c2);
      },
      "control_dir is required");
  require_usage_error(
      [&] {
        load(with("deployment:\n  mode: local_colocated\n  disaggregated:\n    control_dir: /c\n"
                  "    backend: mooncake\n"),
             &c2);
      },
      "requires deployment.mode=disaggregated");
  require_usage_error(
      [&] {
        load(with("deployment:\n  mode: disaggregated\n  disaggregated:\n    control_dir: /c\n"
                  "    backend: mooncake\n    managed_local:\n      shutdown_grace_s: 3\n"),
             &c2);
      },
      "managed_local");
}

TEST_CASE("an fsdp-train run file is not taken for the typed schema", "[config]") {
  CHECK(fsdp::config::detail::is_specforge_schema_text(kMinimal));
  CHECK_FALSE(fsdp::config::detail::is_specforge_schema_text("learning_rate: 1e-4\nseed: 3\n"));
  CHECK_FALSE(fsdp::config::detail::is_specforge_schema_text("model: x\n"));
  TrainConfig cfg;
  const ConfigFileLoad r = load("learning_rate: 2e-4\n", &cfg);
  CHECK_FALSE(r.specforge_schema);
  CHECK(cfg.optim.learning_rate == 2e-4);
  CHECK(cfg.loop.seed == 0);  // fsdp-train's (the offline script's) default, not 42
}

TEST_CASE("the key table covers SpecForge's sections and names real options", "[config]") {
  std::map<std::string, int> per_section;
  for (const auto& k : specforge_schema_keys()) {
    const size_t dot = k.path.find('.');
    per_section[dot == std::string::npos ? "(top)" : k.path.substr(0, dot)]++;
    CHECK_FALSE(k.effect.empty());
    if (k.use == SchemaUse::kSets && k.effect.rfind("`--", 0) == 0) {
      const std::string flag = k.effect.substr(1, k.effect.find_first_of("` ", 1) - 1);
      INFO(k.path << " -> " << flag);
      CHECK(find_option(flag) != nullptr);
    }
  }
  // Key counts of SpecForge's schema.py models (ModelConfig, DataConfig, TrainingConfig, ...).
  CHECK(per_section["model"] == 41);
  CHECK(per_section["data"] == 14);
  CHECK(per_section["training"] == 45);
  CHECK(per_section["deployment"] == 25);
  CHECK(per_section["tracking"] == 12);
  CHECK(per_section["profiling"] == 4);
  CHECK(per_section["runtime"] == 7);
  CHECK(per_section["(top)"] == 2);
}

TEST_CASE("docs/migration-from-specforge.md carries the generated key table", "[config]") {
  fsdp::test::check_generated_section(
      std::string(FSDP_SOURCE_DIR) + "/docs/migration-from-specforge.md",
      "<!-- BEGIN GENERATED SPECFORGE KEYS (lib/config/specforge_schema.cpp) -->\n",
      "<!-- END GENERATED SPECFORGE KEYS -->", specforge_schema_markdown(),
      "<build>/tests/unit_config \"[#specforge_schema]\" --filenames-as-tags");
}
