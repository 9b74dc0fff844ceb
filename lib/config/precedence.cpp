// The command line's place in the order of precedence (options.h): it is applied last, over
// defaults and files, through the same setters as YAML. Foreign layers (SpecForge's typed file,
// a ds_config) are lib/compat's; this file knows only fsdp-train's own rows and their aliases.
#include "config/options.h"
#include "core/error.h"

namespace fsdp::config {

namespace {

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
  FSDP_USAGE_CHECK(same_option_value(before, target->get(probe)),
                   str(alias.flag(), " (SpecForge's spelling) and ", target->flag(), " ",
                       before.text, " are both given and disagree"),
                   str("keep one of them"));
}

}  // namespace

bool same_option_value(const OptionValue& a, const OptionValue& b) {
  return a.is_null == b.is_null && a.text == b.text && a.list == b.list;
}

void apply_command_line(const CommandLineValues& cli, TrainConfig* cfg,
                        std::vector<std::string>* explicit_names) {
  for (const bool aliases : {false, true}) {
    for (const auto& [name, value] : cli.given) {
      const OptionSpec* spec = find_option(name);
      FSDP_USAGE_CHECK(spec != nullptr, str("unknown option --", name),
                       str("did you mean --", closest_option(name), "?"));
      if (spec->alias_of.empty() == aliases) continue;
      if (aliases) check_alias_agrees(*spec, value, cli);
      spec->set(*cfg, value, spec->flag());
      explicit_names->push_back(spec->alias_of.empty() ? spec->name : spec->alias_of);
      cfg->given_options[explicit_names->back()] = spec->flag();
    }
  }
}

}  // namespace fsdp::config
