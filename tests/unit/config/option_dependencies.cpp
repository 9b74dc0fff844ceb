// The dependency rule of the option table (options.h OptionDependency): every row that declares
// a primary is walked; given alone (as a flag and as a key of a --config file) it is a usage
// error naming the primary, given with its primary it is accepted. Keys of SpecForge's typed
// schema, inert values, defaults and a saved run_config.yaml follow the same rule.
#include <algorithm>

#include "config/train_config.h"
#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::kRequiredFlags;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::scratch_dir;
using fsdp::config::test::write_file;

namespace {

// A value for the dependent that asks for something (never its inert value).
std::string sample_value(const OptionSpec& s) {
  const std::string inert = s.depends_on->inert_value;
  switch (s.kind) {
    case OptionKind::kBool:
      return "true";
    case OptionKind::kEnum:
      return s.choices.back();
    case OptionKind::kList:
      return s.choices.front();
    default:
      break;
  }
  const std::string def = s.default_text();
  if (def != inert && def != "\"\"" && def != "none" && !s.secret) return def;
  if (s.kind == OptionKind::kInt || s.kind == OptionKind::kOptInt) return "1";
  // Inside every float bound the table uses ((0, 1) for learning rates).
  if (s.kind == OptionKind::kFloat || s.kind == OptionKind::kOptFloat) return "0.5";
  return "x";
}

// Flags that turn the primary on, and (when its default is on) flags that turn it off.
std::vector<std::string> primary_on(const OptionDependency& d) {
  const OptionSpec& p = option(d.option);
  if (!d.values.empty()) return {p.flag(), d.values.front()};
  if (p.kind == OptionKind::kBool) return {p.flag()};
  if (p.kind == OptionKind::kInt || p.kind == OptionKind::kFloat) return {p.flag(), "2"};
  return {p.flag(), "x"};
}
std::vector<std::string> primary_off(const OptionDependency& d) {
  const OptionSpec& p = option(d.option);
  if (!p.is_on(TrainConfig{}, d.values)) return {};
  for (const auto& c : p.choices)
    if (std::find(d.values.begin(), d.values.end(), c) == d.values.end()) return {p.flag(), c};
  FAIL("no value turns " << p.flag() << " off");
  return {};
}

void validate_given(const CommandLineValues& cli) {
  ResolveOptions ro;
  ro.world_size = 1;  // a typed file's per-rank batch becomes the global batch
  const TrainConfig c = resolve(cli, ro);
  ValidateOptions vo;
  vo.check_paths = false;
  validate(c, 1, vo);
}

CommandLineValues args(std::vector<std::string> extra, const std::string& config_file = "") {
  std::vector<std::string> all = kRequiredFlags;
  all.insert(all.end(), extra.begin(), extra.end());
  CommandLineValues cli = fsdp::config::test::parse_args(all);
  cli.config_file = config_file;
  return cli;
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<const OptionSpec*> dependents() {
  std::vector<const OptionSpec*> out;
  for (const auto& s : option_table())
    if (s.depends_on && s.alias_of.empty()) out.push_back(&s);
  return out;
}

}  // namespace

TEST_CASE("the table declares the dependents, each on an existing independent primary",
          "[config]") {
  const auto deps = dependents();
  // The ones issue 37 names, and the audit's (docs/configuration.md lists them all).
  for (const char* name :
       {"lora-alpha", "lora-targets", "export-lora-adapters", "packing-budget", "kl-scale",
        "kl-decay", "noise-type", "profile-start-step", "profile-dir", "eval-steps",
        "wandb-project", "tensorboard-dir", "mlflow-run-name", "reshard-between-uses"}) {
    INFO(name);
    CHECK(option(name).depends_on.has_value());
  }
  for (const OptionSpec* s : deps) {
    INFO(s->flag());
    const OptionSpec* primary = find_option(s->depends_on->option);
    REQUIRE(primary != nullptr);
    CHECK_FALSE(primary->depends_on.has_value());
    // Without the primary a default configuration leaves every dependent meaningless.
    if (primary_off(*s->depends_on).empty()) CHECK_FALSE(s->is_meaningful(TrainConfig{}));
  }
}

TEST_CASE("every dependent given as a flag without its primary is a usage error naming it",
          "[config]") {
  for (const OptionSpec* s : dependents()) {
    const OptionDependency& d = *s->depends_on;
    const std::vector<std::string> dep = {s->flag(), sample_value(*s)};
    INFO(dep[0] << " " << dep[1] << " (requires " << d.text() << ")");
    const auto off = primary_off(d);
    require_usage_error([&] { validate_given(args(dep + off)); }, "without " + d.text());
    require_usage_error([&] { validate_given(args(dep + off)); }, s->flag());
    CHECK_NOTHROW(validate_given(args(dep + primary_on(d))));
    // A defaulted dependent is never an error, and an inert value asks for nothing.
    CHECK_NOTHROW(validate_given(args(off)));
    if (!d.inert_value.empty())
      CHECK_NOTHROW(validate_given(args(std::vector<std::string>{s->flag(), d.inert_value} + off)));
  }
}

TEST_CASE("every dependent given as a YAML key without its primary is a usage error naming it",
          "[config]") {
  const std::string dir = scratch_dir("option_dependencies");
  for (const OptionSpec* s : dependents()) {
    if (s->cli_only) continue;
    const OptionDependency& d = *s->depends_on;
    INFO(s->yaml_key() << " (requires " << d.text() << ")");
    const auto off = primary_off(d);
    const std::string file = dir + "/" + s->yaml_key() + ".yaml";
    write_file(file, s->yaml_key() + ": " + sample_value(*s) + "\n");
    require_usage_error([&] { validate_given(args(off, file)); }, "without " + d.text());
    require_usage_error([&] { validate_given(args(off, file)); }, file);
    CHECK_NOTHROW(validate_given(args(primary_on(d), file)));
  }
}

TEST_CASE("typed SpecForge keys follow the rule of the options they set", "[config]") {
  const std::string dir = scratch_dir("option_dependencies_typed");
  struct Case {
    std::string alone, with_primary, primary;
  };
  const std::vector<Case> cases = {
      {"profiling:\n  start_step: 5\n", "profiling:\n  enabled: true\n  start_step: 5\n",
       "--profile"},
      {"training:\n  kl_scale: 2.0\n", "training:\n  kl_scale: 2.0\n  lk_loss_type: lambda\n",
       "--lk-loss-type lambda"},
      {"tracking:\n  wandb_project: p\n", "tracking:\n  wandb_project: p\n  report_to: wandb\n",
       "--report-to wandb"},
  };
  const std::string base =
      "model:\n  target_model_path: /t\n  draft_model_config: /d.json\n"
      "data:\n  hidden_states_path: /h\n";
  for (const auto& c : cases) {
    INFO(c.alone);
    const std::string file = dir + "/run.yaml";
    write_file(file, base + c.alone);
    CommandLineValues cli;
    cli.config_file = file;
    require_usage_error([&] { validate_given(cli); }, "without " + c.primary);
    write_file(file, base + c.with_primary);
    CHECK_NOTHROW(validate_given(cli));
  }
}

TEST_CASE("a saved configuration leaves out what its primaries leave off and reads back",
          "[config]") {
  const std::string dir = scratch_dir("option_dependencies_saved");
  for (const auto& extra : {std::vector<std::string>{},
                            std::vector<std::string>{"--lora-rank", "4", "--lora-alpha", "8",
                                                     "--packing", "--packing-budget", "4096"}}) {
    const TrainConfig c = resolve(args(extra));
    const std::string yaml = to_yaml(c);
    CHECK((yaml.find("lora_alpha:") != std::string::npos) == !extra.empty());
    CHECK((yaml.find("packing_budget:") != std::string::npos) == !extra.empty());
    write_file(dir + "/run_config.yaml", yaml);
    CommandLineValues cli;
    cli.config_file = dir + "/run_config.yaml";
    CHECK_NOTHROW(validate_given(cli));
    CHECK(to_yaml(resolve(cli)) == yaml);
  }
}
