// CLI11 side of the option table (options.h): registers every row as a flag and collects what the
// user typed as text, so the command line is parsed by the same setters as YAML and ds_config.
// Only collects; never applies values or validates here.
#include <CLI/CLI.hpp>

#include <deque>

#include "config/options.h"
#include "core/error.h"

namespace fsdp::config {

namespace {

std::string type_name(const OptionSpec& s) {
  switch (s.kind) {
    case OptionKind::kString:
      return "TEXT";
    case OptionKind::kPath:
      return "PATH";
    case OptionKind::kInt:
      return "INT";
    case OptionKind::kFloat:
      return "FLOAT";
    case OptionKind::kBool:
      return "[true|false]";
    case OptionKind::kOptInt:
      return "INT|none";
    case OptionKind::kOptFloat:
      return "FLOAT|none";
    case OptionKind::kResume:
      return "[auto|none|PATH]";
    case OptionKind::kEnum:
    case OptionKind::kList: {
      std::string t = "{";
      for (size_t i = 0; i < s.choices.size(); ++i) t += (i ? "," : "") + s.choices[i];
      return t + (s.kind == OptionKind::kList ? "}..." : "}");
    }
  }
  return "";
}

// Storage CLI11 writes into; the collected values come from Option::results().
struct Storage {
  std::deque<std::string> strings;
  std::deque<std::vector<std::string>> lists;
};

}  // namespace

void add_train_options(CLI::App& app, TrainOptionsBinding* binding) {
  FSDP_ASSERT(binding != nullptr && binding->storage_ == nullptr,
              "add_train_options needs a fresh binding (one call per binding)");
  auto storage = std::make_shared<Storage>();
  binding->storage_ = storage;
  Storage& st = *storage;
  for (const auto& spec : option_table()) {
    if (app.get_option_no_throw(spec.flag()) != nullptr) continue;
    std::string desc = spec.help;
    if (spec.depends_on) desc += " (requires " + spec.depends_on->text() + ")";
    if (!spec.secret && !spec.cli_only) desc += " [default: " + spec.default_text() + "]";
    CLI::Option* opt = nullptr;
    switch (spec.kind) {
      case OptionKind::kBool:
        // An option with an optional value rather than a CLI11 flag, so "--x=maybe" reaches our
        // parser and gets the same message as in YAML.
        opt = app.add_option(spec.flag(), st.strings.emplace_back(), desc)->expected(0, 1);
        break;
      case OptionKind::kList:
        opt = app.add_option(spec.flag(), st.lists.emplace_back(), desc)->expected(1, 16);
        break;
      case OptionKind::kResume:
        opt = app.add_option(spec.flag(), st.strings.emplace_back(), desc)->expected(0, 1);
        break;
      default:
        // SpecForge's `specforge train -c run.yaml` spelling too.
        opt = app.add_option(spec.name == "config" ? "-c," + spec.flag() : spec.flag(),
                             st.strings.emplace_back(), desc);
        break;
    }
    opt->group(spec.group);
    // Repeating a flag overrides (scripts append overrides); lists collect every value.
    if (spec.kind != OptionKind::kList) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    const std::string tn = type_name(spec);
    if (!tn.empty()) opt->type_name(tn);
    binding->options_.emplace_back(&spec, opt);
  }
  // Words without a flag: SpecForge's dotted overrides after the file (section.key=value).
  binding->overrides_ =
      app.add_option("overrides", st.lists.emplace_back(),
                     "SpecForge's typed-config overrides after -c/--config FILE, e.g. "
                     "training.learning_rate=5e-5 (docs/migration-from-specforge.md)")
          ->group("Configuration file");
}

CommandLineValues TrainOptionsBinding::values() const {
  CommandLineValues out;
  for (const auto& [spec, opt] : options_) {
    if (opt->count() == 0) continue;
    const std::vector<std::string>& res = opt->results();
    OptionValue v;
    switch (spec->kind) {
      case OptionKind::kBool:
        // A bare flag means true; "--x=false" or "--x false" give the value.
        v.text = res.empty() || res.back().empty() ? "true" : res.back();
        break;
      case OptionKind::kList:
        v.list = res;
        break;
      case OptionKind::kResume:
        v.text = res.empty() ? "auto" : res.back();
        break;
      default:
        v.text = res.empty() ? "" : res.back();
        break;
    }
    if (spec->name == "config") {
      // One file: a second --config would silently replace the first.
      FSDP_USAGE_CHECK(
          res.size() <= 1,
          str("--config is given ", res.size(), " times (", res.front(), ", ", res.back(), ")"),
          "give one YAML run file; override single keys with flags after it");
      out.config_file = v.text;
      continue;
    }
    out.given[spec->name] = v;
  }
  if (overrides_ != nullptr) {
    for (const auto& word : overrides_->results()) {
      // A stray word that is no override gets the same advice as an unknown flag.
      if (word.find('=') == std::string::npos || word.rfind("-", 0) == 0) {
        const UnknownFlagAdvice advice = advise_unknown_flag(word);
        FSDP_USAGE_FAIL(advice.message, advice.hint);
      }
      out.overrides.push_back(word);
    }
  }
  return out;
}

}  // namespace fsdp::config
