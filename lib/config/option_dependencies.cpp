// The option table's dependency rule (options.h OptionDependency): whether an option means
// anything in a configuration, and the start-up check that an option given explicitly has its
// primary on. Never consults defaults as "given": only TrainConfig::given_options counts.
#include <algorithm>

#include "config/options.h"
#include "config/train_config.h"
#include "config/value_parse.h"
#include "core/error.h"

namespace fsdp::config {

namespace {

// A dependent's value that asks for nothing and so needs no primary (false, --eval-steps 0).
bool asks_nothing(const OptionSpec& spec, const TrainConfig& cfg) {
  const std::string& inert = spec.depends_on->inert_value;
  return !inert.empty() && detail::to_lower(spec.get(cfg).text) == inert;
}

}  // namespace

std::string OptionDependency::text() const {
  std::string t = "--" + option;
  for (size_t i = 0; i < values.size(); ++i) t += (i ? " or " : " ") + values[i];
  return t;
}

bool OptionSpec::is_on(const TrainConfig& cfg, const std::vector<std::string>& values) const {
  const OptionValue v = get(cfg);
  if (!values.empty()) {
    const auto listed = [&](const std::string& x) {
      return kind == OptionKind::kList ? std::find(v.list.begin(), v.list.end(), x) != v.list.end()
                                       : detail::to_lower(v.text) == x;
    };
    return std::any_of(values.begin(), values.end(), listed);
  }
  if (kind == OptionKind::kList) return !v.list.empty();
  const std::string t = detail::to_lower(v.text);
  return !v.is_null && !t.empty() && t != "none" && v.text != default_text();
}

bool OptionSpec::is_meaningful(const TrainConfig& cfg) const {
  return !depends_on || option(depends_on->option).is_on(cfg, depends_on->values);
}

void check_option_dependencies(const TrainConfig& cfg) {
  for (const auto& [name, source] : cfg.given_options) {
    const OptionSpec& spec = option(name);
    if (spec.is_meaningful(cfg) || asks_nothing(spec, cfg)) continue;
    const OptionDependency& dep = *spec.depends_on;
    const std::string where = source == spec.flag() ? "" : " (set by " + source + ")";
    FSDP_USAGE_FAIL(str(spec.flag(), where, " has no effect without ", dep.text()),
                    str("give ", dep.text(), " too, or drop ", spec.flag()));
  }
}

}  // namespace fsdp::config
