// Builds the TrainConfig from defaults, the --config YAML file, the --deepspeed ds_config and the
// command line (options.h), in that order of precedence. Never validates the whole
// configuration (validate() does) and never reads anything but the files the user named, except
// the target's config.json when a draft config must be made from it (draft_auto.h) and the
// Hugging Face cache's directories when the target is a repository id (hf_cache.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>

#include "config/deepspeed.h"
#include "config/draft_auto.h"
#include "config/hf_cache.h"
#include "config/options.h"
#include "core/error.h"
#include "core/log.h"

namespace fsdp::config {

namespace {

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

bool same_value(const OptionValue& a, const OptionValue& b) {
  return a.is_null == b.is_null && a.text == b.text && a.list == b.list;
}

// A SpecForge alias given together with the option it names must not say something else
// ("--log-interval 10 --log-steps 20").
void check_alias_agrees(const OptionSpec& alias, const OptionValue& value,
                        const CommandLineValues& cli) {
  const auto given = cli.given.find(alias.alias_of);
  if (given == cli.given.end()) return;
  const OptionSpec* target = find_option(alias.alias_of);
  TrainConfig probe;
  target->set(probe, given->second, target->flag());
  const OptionValue before = target->get(probe);
  alias.set(probe, value, alias.flag());
  FSDP_USAGE_CHECK(same_value(before, target->get(probe)),
                   str(alias.flag(), " (SpecForge's spelling) and ", target->flag(), " ",
                       before.text, " are both given and disagree"),
                   str("keep one of them"));
}

// SpecForge's per-rank batch model: with --batch-size or --draft-accumulation-steps and no
// global batch, one optimizer step takes micro x ranks x accumulation samples.
void derive_specforge_global_batch(const CommandLineValues& cli,
                                   const std::vector<std::string>& explicit_names, int world_size,
                                   bool per_rank_batch, TrainConfig* cfg) {
  const bool specforge_batch = per_rank_batch || cli.given.count("batch-size") > 0 ||
                               cli.given.count("draft-accumulation-steps") > 0;
  const bool global_set = std::find(explicit_names.begin(), explicit_names.end(),
                                    "draft-global-batch-size") != explicit_names.end();
  if (!specforge_batch || global_set || world_size <= 0) return;
  const int64_t accumulation = cfg->loop.gradient_accumulation_steps.value_or(1);
  cfg->loop.draft_global_batch_size = cfg->loop.draft_micro_batch_size * world_size * accumulation;
}

}  // namespace

TrainConfig resolve(const CommandLineValues& cli, const ResolveOptions& options) {
  TrainConfig cfg;
  std::vector<std::string> explicit_names;
  bool per_rank_batch = false;
  if (!cli.config_file.empty()) {
    ConfigFileLoad file =
        load_config_file(cli.config_file, cli.overrides, &cfg, options.world_size);
    explicit_names = std::move(file.set_options);
    per_rank_batch = file.specforge_schema;
    cfg.config_file = cli.config_file;
    for (const auto& name : explicit_names) cfg.given_options[name] = cli.config_file;
    for (const auto& line : file.report) {
      if (options.report) {
        options.report->push_back(line);
      } else {
        FSDP_LOG0(kInfo) << line;
      }
    }
  } else {
    FSDP_USAGE_CHECK(cli.overrides.empty(),
                     str("'", cli.overrides.empty() ? "" : cli.overrides.front(),
                         "': section.key=value overrides need --config FILE (SpecForge's typed "
                         "schema) before them"),
                     "give -c run.yaml first, or use flags (--learning-rate 5e-5)");
  }
  // Our own names first, then the SpecForge aliases (which may add to what they set).
  for (const bool aliases : {false, true}) {
    for (const auto& [name, value] : cli.given) {
      const OptionSpec* spec = find_option(name);
      FSDP_USAGE_CHECK(spec != nullptr, str("unknown option --", name),
                       str("did you mean --", closest_option(name), "?"));
      if (spec->alias_of.empty() == aliases) continue;
      if (aliases) check_alias_agrees(*spec, value, cli);
      spec->set(cfg, value, spec->flag());
      explicit_names.push_back(spec->alias_of.empty() ? spec->name : spec->alias_of);
      cfg.given_options[explicit_names.back()] = spec->flag();
    }
  }
  // SpecForge resolves repository ids through the Hugging Face cache and makes a draft config
  // from the target when none is given; so do we.
  for (const std::string& note : {resolve_hub_target(&cfg), generate_missing_draft_config(&cfg)}) {
    if (note.empty()) continue;
    if (options.report) {
      options.report->push_back(note);
    } else {
      FSDP_LOG0(kInfo) << note;
    }
  }
  if (cfg.deepspeed_config.empty()) {
    derive_specforge_global_batch(cli, explicit_names, options.world_size, per_rank_batch, &cfg);
    return cfg;
  }

  DeepSpeedContext ctx;
  ctx.base = &cfg;
  ctx.explicit_options = explicit_names;
  ctx.world_size = options.world_size;
  ctx.hidden_size =
      options.hidden_size ? options.hidden_size : read_hidden_size(cfg.model.draft_model_config);
  const DeepSpeedTranslation tr = translate_deepspeed_file(cfg.deepspeed_config, ctx);
  for (const auto& [name, value] : tr.settings) {
    const OptionSpec* spec = find_option(name);
    FSDP_ASSERT(spec != nullptr, "ds_config translation produced an unknown option " + name);
    const auto it = tr.setting_source.find(name);
    const std::string src =
        str(cfg.deepspeed_config, " ", it == tr.setting_source.end() ? name : it->second);
    const bool is_explicit =
        std::find(explicit_names.begin(), explicit_names.end(), name) != explicit_names.end();
    if (is_explicit) {
      TrainConfig probe = cfg;
      spec->set(probe, value, src);
      FSDP_USAGE_CHECK(same_value(spec->get(probe), spec->get(cfg)),
                       str(src, " sets ", spec->flag(), " ", spec->get(probe).text,
                           ", but the command line or YAML file set ", spec->get(cfg).text),
                       str("remove one of them, or write \"auto\" for the key in the ds_config"));
      continue;
    }
    spec->set(cfg, value, src);
  }
  // A global batch from the ds_config (train_batch_size) counts as given.
  std::vector<std::string> given = explicit_names;
  for (const auto& [name, value] : tr.settings) given.push_back(name);
  derive_specforge_global_batch(cli, given, options.world_size, per_rank_batch, &cfg);
  if (options.report) {
    options.report->insert(options.report->end(), tr.report.begin(), tr.report.end());
  } else {
    FSDP_LOG0(kInfo) << "ds_config " << cfg.deepspeed_config << " translated:";
    for (const auto& line : tr.report) {
      if (line.rfind("warning: ", 0) == 0) {
        FSDP_LOG0(kWarn) << "ds_config " << line.substr(9);
      } else {
        FSDP_LOG0(kInfo) << "  " << line;
      }
    }
  }
  return cfg;
}

}  // namespace fsdp::config
