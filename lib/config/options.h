// The one option table of fsdp-train (one source of truth, so help and parser never drift): every
// row produces a CLI11 flag, a YAML key, its --help text, its line in docs/usage.md and
// docs/configuration.md, and its entry in the effective configuration that a run prints and saves.
// Never declare a training option anywhere else. CLI11, yaml-cpp and JSON stay inside lib/config's
// .cpp files (compile time).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace fsdp::config {

// Spelling rule: the flag is "--" + name ("--draft-micro-batch-size"); the YAML key is the name
// with '-' replaced by '_' ("draft_micro_batch_size"). YAML files may also use the dashed
// spelling; saved configurations always use underscores.
enum class OptionKind {
  kString,    // free text
  kPath,      // a file or directory
  kInt,       // int64
  kFloat,     // double
  kBool,      // flag: "--x" or "--x=false" on the command line; true/false in YAML
  kEnum,      // one of choices
  kList,      // several of choices: "--report-to wandb tensorboard" or a YAML sequence
  kOptInt,    // int64 or unset ("none"/null)
  kOptFloat,  // double or unset
  kResume,    // --resume [auto|none|PATH]: bare flag means auto (SpecForge's store_true)
};

// A value in text form; is_null for unset optional values. Lists use `list`.
struct OptionValue {
  bool is_null = false;
  std::string text;
  std::vector<std::string> list;
};

// The accepted range of a numeric option (kInt, kOptInt, kFloat, kOptFloat). The table is the one
// place bounds live: values are checked against them when parsed (flag, YAML key, ds_config
// key), validate() checks the whole configuration against them, and other code that needs a
// bound (the data loader) reads it from the row.
struct NumericBounds {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;  // exclusive ends: (0, 1) for the learning rate
  bool max_open = false;
  // Report both sides as "is outside [min, max)" (rates and fractions) rather than
  // "must be positive" / "is above its maximum".
  bool as_interval = false;
  // What to give instead; empty: "give --flag a whole number from min to max" + zero_means.
  std::string hint;
  std::string zero_means;  // e.g. " (0: off)"
  // The range as docs show it: "1..1000000", "(0, 1)", ">= 0".
  std::string text(bool integer) const;
};

// What an option needs to mean anything: the option (the primary) that must be on. An option
// given explicitly (flag, YAML key, key of SpecForge's typed schema) while its primary is off is a
// usage error naming the primary (validate(), train_config.h); a defaulted one is never checked.
struct OptionDependency {
  std::string option;  // the primary's name, e.g. "lora-rank"
  // Values of the primary that turn this option on (a list primary: one of them listed); empty:
  // any value but the primary's default, "" and "none" (true, non-zero, a path).
  std::vector<std::string> values;
  // A value of this option that asks for nothing and is accepted without the primary ("0" for
  // --eval-steps: evaluation off); empty: none.
  std::string inert_value;
  // "--lora-rank", "--report-to wandb", "--sharding-strategy full_shard or hybrid_shard".
  std::string text() const;
};

struct OptionSpec {
  std::string name;  // flag without dashes, e.g. "draft-micro-batch-size"
  OptionKind kind;
  std::string group;  // heading in --help and the docs: "Model", "Data", ...
  std::string help;   // one line; says "(unused: ...)" for accepted-but-unused SpecForge flags
  std::vector<std::string> choices;  // kEnum / kList
  bool cli_only = false;             // not a YAML key and not saved (--config)
  bool secret = false;               // never printed, saved or logged (--wandb-key)
  // Another spelling (a SpecForge version's name) of the option named here: command line only,
  // applied after the options it may modify, and an error when both are given differently.
  std::string alias_of;
  // Parses the text form into the typed field; throws UsageError naming `source`
  // ("--learning-rate" or "run.yaml:12 learning_rate").
  std::function<void(TrainConfig&, const OptionValue&, const std::string& source)> set;
  std::function<OptionValue(const TrainConfig&)> get;
  std::optional<NumericBounds> bounds;         // numeric kinds only; unset: any representable value
  std::optional<OptionDependency> depends_on;  // unset: meaningful on its own

  // Throw a UsageError naming `source` (default: the flag) when the value is out of bounds.
  void check_int(int64_t v, const std::string& source = "") const;
  void check_float(double v, const std::string& source = "") const;
  // Checks the value `cfg` holds for this option (validate() does so for every bounded row).
  void check_value(const TrainConfig& cfg) const;

  std::string flag() const { return "--" + name; }
  std::string yaml_key() const;
  // The default as shown in --help and docs ("16", "none", "[]").
  std::string default_text() const;
  // Whether `cfg` turns this option on in the sense of a dependent's OptionDependency::values.
  bool is_on(const TrainConfig& cfg, const std::vector<std::string>& values) const;
  // False when this option depends on a primary that `cfg` leaves off (it then means nothing:
  // the saved configuration leaves it out).
  bool is_meaningful(const TrainConfig& cfg) const;
};

// The dependency rule over the whole table: every option in `cfg.given_options` whose primary
// `cfg` leaves off is a UsageError naming both (validate() calls it).
void check_option_dependencies(const TrainConfig& cfg);

// The table, in the order of --help and the docs.
const std::vector<OptionSpec>& option_table();
// nullptr when unknown. Accepts "learning-rate", "learning_rate" and "--learning-rate".
const OptionSpec* find_option(const std::string& name);
// The row of an option the caller knows exists (code, not user input): asserts.
const OptionSpec& option(const std::string& name);
// The known name closest to `name` (edit distance), for "did you mean" messages.
std::string closest_option(const std::string& name);

// What to tell a user who typed a flag the table does not have: SpecForge flags of features
// fsdp-train does not offer (the SwanLab tracker, the SGLang online target backend) get the
// reason; others a "did you mean". `arg` is the word as typed ("--foo", "--foo=1").
struct UnknownFlagAdvice {
  std::string message;
  std::string hint;
};
UnknownFlagAdvice advise_unknown_flag(const std::string& arg);

// SpecForge's SwanLab tracker is refused by name wherever it can be asked for (its flags,
// `--report-to swanlab`, the typed YAML's tracking.swanlab_* keys): one reason, one advice.
inline constexpr const char* kSwanLabRefused = "SpecForge's SwanLab tracker is not supported";
inline constexpr const char* kSwanLabAdvice =
    "use wandb, mlflow and/or tensorboard (metrics.jsonl is always written)";

// Values the user typed, by option name, in command-line order of precedence.
struct CommandLineValues {
  std::map<std::string, OptionValue> given;  // only options present on the command line
  std::string config_file;                   // --config (or -c)
  // SpecForge's dotted overrides after the file ("training.learning_rate=5e-5"): only with a
  // file in SpecForge's typed schema (specforge_schema.h).
  std::vector<std::string> overrides;
};

// Owns the CLI11 options that add_train_options created; read it after app.parse().
class TrainOptionsBinding {
 public:
  CommandLineValues values() const;

 private:
  friend void add_train_options(CLI::App& app, TrainOptionsBinding* binding);
  std::vector<std::pair<const OptionSpec*, CLI::Option*>> options_;
  CLI::Option* overrides_ = nullptr;  // positional section.key=value words
  std::shared_ptr<void> storage_;     // what CLI11 writes into; lives as long as the binding
};

// Adds every option of the table to `app` (root or subcommand), grouped as in the docs. Options
// whose flag `app` already has (e.g. a root --log-level) are skipped and not collected.
void add_train_options(CLI::App& app, TrainOptionsBinding* binding);

// Precedence of the command line (precedence.cpp): applies `cli.given` over `cfg`, fsdp-train's
// own names first, then SpecForge's aliases (which may add to what their option set; an alias
// that says something else than its option, both given, is a UsageError). Appends the names set
// to `explicit_names` and records each in cfg->given_options. An unknown name is a UsageError.
void apply_command_line(const CommandLineValues& cli, TrainConfig* cfg,
                        std::vector<std::string>* explicit_names);
// Whether two option values say the same (null, text and list).
bool same_option_value(const OptionValue& a, const OptionValue& b);

// The text of a --config file; a directory or an unreadable file is a UsageError naming it.
std::string read_config_file(const std::string& path);
// Loads a YAML run file into `cfg` (keys of the table only). Unknown keys fail with the file
// name, line and the closest known key. Returns the names of the options the file set.
std::vector<std::string> apply_yaml_file(const std::string& path, TrainConfig* cfg);
// Same for YAML text (tests); `source_name` stands in for the file name in messages.
std::vector<std::string> apply_yaml_text(const std::string& text, const std::string& source_name,
                                         TrainConfig* cfg);

// The effective configuration (every non-secret, non-cli-only option) as YAML that --config
// accepts back, and as a JSON object text (for checkpoints and run metadata).
std::string to_yaml(const TrainConfig& cfg);
std::string to_json(const TrainConfig& cfg, int indent = 2);
// The same configuration with every file and directory path made absolute (against the current
// directory, lexically: symbolic links are kept): what run_config.yaml and the checkpoints
// record, so that `--config run_config.yaml` works from any directory.
TrainConfig with_absolute_paths(const TrainConfig& cfg);
// Human-readable "key: value" lines grouped like --help, for the start-up banner.
std::string to_display(const TrainConfig& cfg);

// Markdown generated from the table (docs/configuration.md's reference and the flag section of
// docs/usage.md); the unit test config.docs checks the checked-in files (FSDP_UPDATE_DOCS=1
// rewrites them).
std::string configuration_markdown();
std::string usage_flags_markdown();
// The bounds of every numeric option (docs/usage.md, Limits).
std::string usage_limits_markdown();

}  // namespace fsdp::config
