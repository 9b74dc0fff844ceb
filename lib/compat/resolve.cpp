// The layers of resolve() (resolve.h), one function each, and their order. Never validates the
// whole configuration (validate() does) and never reads anything but the files the user named,
// except through the discovery step (config/discovery/discover.h).
#include "compat/resolve.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>

#include "compat/config_file.h"
#include "compat/deepspeed.h"
#include "config/discovery/discover.h"
#include "core/error.h"
#include "core/log.h"

namespace fsdp::config {

namespace {

// What the layers so far set explicitly.
struct Given {
  std::vector<std::string> names;  // option names, from the file and the command line
  bool per_rank_batch = false;     // a SpecForge typed file: its batch sizes are per rank
};

void emit(const std::string& line, const ResolveOptions& options) {
  if (options.report) {
    options.report->push_back(line);
  } else {
    FSDP_LOG0(kInfo) << line;
  }
}

// hidden_size of the draft model JSON when the file is readable; the model loader reports a
// broken file properly later, so failures here only mean "unknown".
std::optional<int64_t> read_hidden_size(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in.good()) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.contains("hidden_size") && j["hidden_size"].is_number_integer())
      return j["hidden_size"].get<int64_t>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

void apply_config_file(const CommandLineValues& cli, const ResolveOptions& options,
                       TrainConfig* cfg, Given* given) {
  if (cli.config_file.empty()) {
    FSDP_USAGE_CHECK(cli.overrides.empty(),
                     str("'", cli.overrides.empty() ? "" : cli.overrides.front(),
                         "': section.key=value overrides need --config FILE (SpecForge's typed "
                         "schema) before them"),
                     "give -c run.yaml first, or use flags (--learning-rate 5e-5)");
    return;
  }
  ConfigFileLoad file = load_config_file(cli.config_file, cli.overrides, cfg, options.world_size);
  given->names = std::move(file.set_options);
  given->per_rank_batch = file.specforge_schema;
  cfg->config_file = cli.config_file;
  for (const auto& name : given->names) cfg->given_options[name] = cli.config_file;
  for (const auto& line : file.report) emit(line, options);
}

// SpecForge's per-rank batch model, for its flags and its typed file alike: with --batch-size or
// --draft-accumulation-steps (or a typed file) and no global batch, one optimizer step takes
// micro x ranks x accumulation samples.
void derive_specforge_global_batch(const CommandLineValues& cli,
                                   const std::vector<std::string>& set_names, int world_size,
                                   bool per_rank_batch, TrainConfig* cfg) {
  const bool specforge_batch = per_rank_batch || cli.given.count("batch-size") > 0 ||
                               cli.given.count("draft-accumulation-steps") > 0;
  const bool global_set =
      std::find(set_names.begin(), set_names.end(), "draft-global-batch-size") != set_names.end();
  if (!specforge_batch || global_set || world_size <= 0) return;
  const int64_t accumulation = cfg->loop.gradient_accumulation_steps.value_or(1);
  const int64_t global = cfg->loop.draft_micro_batch_size * world_size * accumulation;
  option("draft-global-batch-size")
      .set(*cfg, OptionValue{false, std::to_string(global), {}},
           "--batch-size x ranks x --draft-accumulation-steps");
}

// One ds_config setting: applied when no flag or file key set the option, else it must agree.
void apply_deepspeed_setting(const std::string& name, const OptionValue& value,
                             const std::string& src, const Given& given, TrainConfig* cfg) {
  const OptionSpec* spec = find_option(name);
  FSDP_ASSERT(spec != nullptr, "ds_config translation produced an unknown option " + name);
  const bool is_explicit =
      std::find(given.names.begin(), given.names.end(), name) != given.names.end();
  if (!is_explicit) {
    spec->set(*cfg, value, src);
    return;
  }
  TrainConfig probe = *cfg;
  spec->set(probe, value, src);
  FSDP_USAGE_CHECK(same_option_value(spec->get(probe), spec->get(*cfg)),
                   str(src, " sets ", spec->flag(), " ", spec->get(probe).text,
                       ", but the command line or YAML file set ", spec->get(*cfg).text),
                   str("remove one of them, or write \"auto\" for the key in the ds_config"));
}

void log_deepspeed_report(const DeepSpeedTranslation& tr, const std::string& file,
                          const ResolveOptions& options) {
  if (options.report) {
    options.report->insert(options.report->end(), tr.report.begin(), tr.report.end());
    return;
  }
  FSDP_LOG0(kInfo) << "ds_config " << file << " translated:";
  for (const auto& line : tr.report) {
    if (line.rfind("warning: ", 0) == 0) {
      FSDP_LOG0(kWarn) << "ds_config " << line.substr(9);
    } else {
      FSDP_LOG0(kInfo) << "  " << line;
    }
  }
}

// The ds_config layer. Returns the option names it set (a global batch from train_batch_size
// counts as given for SpecForge's derivation).
std::vector<std::string> apply_deepspeed(const ResolveOptions& options, const Given& given,
                                         TrainConfig* cfg) {
  DeepSpeedContext ctx;
  ctx.base = cfg;
  ctx.explicit_options = given.names;
  ctx.world_size = options.world_size;
  ctx.hidden_size =
      options.hidden_size ? options.hidden_size : read_hidden_size(cfg->model.draft_model_config);
  const DeepSpeedTranslation tr = translate_deepspeed_file(cfg->deepspeed_config, ctx);
  std::vector<std::string> names;
  for (const auto& [name, value] : tr.settings) {
    const auto it = tr.setting_source.find(name);
    const std::string src =
        str(cfg->deepspeed_config, " ", it == tr.setting_source.end() ? name : it->second);
    apply_deepspeed_setting(name, value, src, given, cfg);
    names.push_back(name);
  }
  log_deepspeed_report(tr, cfg->deepspeed_config, options);
  return names;
}

}  // namespace

TrainConfig resolve(const CommandLineValues& cli, const ResolveOptions& options) {
  TrainConfig cfg;
  Given given;
  apply_config_file(cli, options, &cfg, &given);
  apply_command_line(cli, &cfg, &given.names);
  // SpecForge resolves repository ids through the Hugging Face cache and makes a draft config
  // from the target when none is given; so do we, before the ds_config reads its hidden size.
  for (const auto& note : discover_inputs(&cfg)) emit(note, options);
  std::vector<std::string> set_names = given.names;
  if (!cfg.deepspeed_config.empty()) {
    const std::vector<std::string> ds_names = apply_deepspeed(options, given, &cfg);
    set_names.insert(set_names.end(), ds_names.begin(), ds_names.end());
  }
  derive_specforge_global_batch(cli, set_names, options.world_size, given.per_rank_batch, &cfg);
  return cfg;
}

}  // namespace fsdp::config
