// Markdown generated from the option table (options.h): the whole of docs/configuration.md and
// the flag reference and limits table inside docs/usage.md. A unit test fails when the checked-in
// files differ; FSDP_UPDATE_DOCS=1 makes that test rewrite them. Never hand-edit the generated
// parts.
#include <sstream>

#include "config/options.h"

namespace fsdp::config {

namespace {

std::string kind_text(const OptionSpec& s) {
  switch (s.kind) {
    case OptionKind::kString:
      return "text";
    case OptionKind::kPath:
      return "path";
    case OptionKind::kInt:
      return "integer";
    case OptionKind::kFloat:
      return "number";
    case OptionKind::kBool:
      return "bool";
    case OptionKind::kOptInt:
      return "integer or none";
    case OptionKind::kOptFloat:
      return "number or none";
    case OptionKind::kResume:
      return "auto, none or path";
    case OptionKind::kEnum:
    case OptionKind::kList: {
      std::string t = s.kind == OptionKind::kList ? "list of " : "";
      for (size_t i = 0; i < s.choices.size(); ++i) t += (i ? ", " : "") + s.choices[i];
      return t;
    }
  }
  return "";
}

// Pipes inside table cells would split the cell.
std::string cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

bool integer_kind(const OptionSpec& s) {
  return s.kind == OptionKind::kInt || s.kind == OptionKind::kOptInt;
}

// "integer 1..1000000", "number (0, 1)": the kind with the row's bounds.
std::string type_cell(const OptionSpec& s) {
  return kind_text(s) + (s.bounds ? " " + s.bounds->text(integer_kind(s)) : "");
}

std::string default_cell(const OptionSpec& s) {
  if (s.secret || s.cli_only) return "-";
  return "`" + s.default_text() + "`";
}

// "; requires `--lora-rank`" for an option that means nothing without another.
std::string requires_text(const OptionSpec& s) {
  if (!s.depends_on) return "";
  std::string t = "; requires `" + s.depends_on->text() + "`";
  if (!s.depends_on->inert_value.empty()) t += " (unless `" + s.depends_on->inert_value + "`)";
  return t;
}

}  // namespace

std::string configuration_markdown() {
  std::ostringstream os;
  os << "# Configuration reference\n\n"
     << "<!-- Generated from lib/config/option_table.cpp by the unit test config.docs "
        "(FSDP_UPDATE_DOCS=1 build/tests/unit_config \"[#docs]\" --filenames-as-tags). Do not "
        "edit. "
        "-->\n\n"
     << "Every option of `fsdp-train` is one row of a single table in the source. The same row "
        "gives the command-line flag, the YAML key, the `--help` text and the entry in the "
        "effective configuration that each run prints and saves (`run_config.yaml` in the output "
        "directory, and the same as JSON under `config` in every checkpoint's "
        "`trainer_state.json`).\n\n"
     << "## How values are combined\n\n"
     << "1. Built-in defaults (the tables below).\n"
     << "2. `--config FILE.yaml`: a flat mapping of keys to values.\n"
     << "3. `--deepspeed ds_config.json`: translated key by key "
        "(see [migration-from-deepspeed.md](migration-from-deepspeed.md)). A ds_config value "
        "that contradicts a flag or YAML key you set explicitly is an error naming both; write "
        "`\"auto\"` in the ds_config to take fsdp-train's value.\n"
     << "4. Flags on the command line win over everything else.\n\n"
     << "## YAML keys\n\n"
     << "The YAML key is the flag name without the leading dashes, with `-` replaced by `_`: "
        "`--draft-micro-batch-size 2` is `draft_micro_batch_size: 2`. The dashed spelling "
        "(`draft-micro-batch-size: 2`) is accepted too; saved files always use underscores. "
        "Keys are flat (no nesting). An unknown key stops the run with the file name, the line "
        "and the closest known key. Optional numbers take `null` (or `none`) for \"unset\"; "
        "lists take a YAML sequence (`report_to: [tensorboard, wandb]`). `--config` and "
        "`--wandb-key` exist only on the command line (a key must never sit in a file: prefer "
        "the `WANDB_API_KEY` environment variable).\n\n"
     << "A saved `run_config.yaml` is a valid `--config` file: "
        "`fsdp-train --config outputs/run1/run_config.yaml --output-dir outputs/run2` repeats a "
        "run (its own --output-dir holds its checkpoints, so a fresh start there is refused), "
        "and `fsdp-train --config outputs/run1/run_config.yaml --resume` continues it in place, "
        "from any directory: its paths are written absolute. `--config` takes one file "
        "(given twice, or a directory, it is an error); flags after it override single keys.\n\n"
     << "## Options that need another\n\n"
     << "Some options mean something only together with another one, their primary: the "
        "meaning column says \"requires `--lora-rank`\" (the primary must be on: true, "
        "non-zero, a path) or \"requires `--report-to wandb`\" (the primary must have that "
        "value). Giving such an option explicitly without its primary, as a flag, a key of a "
        "`--config` file or a key of SpecForge's typed schema, stops the run at start-up with "
        "exit code 2 and a message naming the primary: the option would silently do nothing. "
        "A switch given as `false`, and the values the column names after \"unless\", ask for "
        "nothing and are accepted alone. Defaults never count, and a saved `run_config.yaml` "
        "leaves out the options whose primary is off, so it reads back as it was written.\n";
  std::string group;
  for (const auto& spec : option_table()) {
    if (spec.group != group) {
      group = spec.group;
      os << "\n## " << group << "\n\n"
         << "| YAML key | flag | type | default | meaning |\n"
         << "|---|---|---|---|---|\n";
    }
    os << "| " << (spec.cli_only ? "-" : "`" + spec.yaml_key() + "`") << " | `" << spec.flag()
       << "` | " << cell(type_cell(spec)) << " | " << cell(default_cell(spec)) << " | "
       << cell(spec.help + requires_text(spec)) << " |\n";
  }
  return os.str();
}

std::string usage_limits_markdown() {
  std::ostringstream os;
  os << "| flag | range |\n|---|---|\n";
  for (const auto& spec : option_table()) {
    if (!spec.bounds || !spec.alias_of.empty()) continue;
    os << "| `" << spec.flag() << "`";
    for (const auto& alias : option_table()) {
      if (alias.alias_of == spec.name && alias.bounds) os << ", `" << alias.flag() << "`";
    }
    os << " | " << cell(spec.bounds->text(integer_kind(spec))) << " |\n";
  }
  return os.str();
}

std::string usage_flags_markdown() {
  std::ostringstream os;
  std::string group;
  for (const auto& spec : option_table()) {
    if (spec.group != group) {
      group = spec.group;
      os << "\n#### " << group << "\n\n";
    }
    os << "- `" << spec.flag();
    switch (spec.kind) {
      case OptionKind::kBool:
        os << "[=true|false]";
        break;
      case OptionKind::kResume:
        os << " [auto|none|PATH]";
        break;
      case OptionKind::kList:
        os << " SINK...";
        break;
      case OptionKind::kEnum: {
        os << " {";
        for (size_t i = 0; i < spec.choices.size(); ++i) os << (i ? "," : "") << spec.choices[i];
        os << "}";
        break;
      }
      case OptionKind::kInt:
      case OptionKind::kOptInt:
        os << " N";
        break;
      case OptionKind::kFloat:
      case OptionKind::kOptFloat:
        os << " X";
        break;
      case OptionKind::kPath:
        os << " PATH";
        break;
      case OptionKind::kString:
        os << " TEXT";
        break;
    }
    os << "`: " << spec.help << requires_text(spec);
    if (!spec.secret && !spec.cli_only) os << " (default `" << spec.default_text() << "`)";
    os << "\n";
  }
  return os.str();
}

}  // namespace fsdp::config
