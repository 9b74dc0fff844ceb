// YAML run files in, effective configuration out (YAML, JSON, banner) for the option table
// (options.h). Keys are flat: one per option. Never writes secret options (--wandb-key).
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "checkpoint/checkpoint_dir.h"
#include "config/options.h"
#include "config/run_config.h"
#include "config/value_parse.h"
#include "core/error.h"
#include "core/fs_util.h"

namespace fsdp::config {

namespace {

std::string where(const std::string& source, const YAML::Mark& mark) {
  if (mark.line < 0) return source;
  return str(source, ":", mark.line + 1);
}

OptionValue node_value(const YAML::Node& node, const OptionSpec& spec, const std::string& src) {
  OptionValue v;
  if (node.IsNull()) {
    v.is_null = true;
    return v;
  }
  if (node.IsScalar()) {
    v.text = node.Scalar();
    if (spec.kind == OptionKind::kList) v.list = {v.text};
    return v;
  }
  if (node.IsSequence() && spec.kind == OptionKind::kList) {
    for (const auto& item : node) {
      FSDP_USAGE_CHECK(item.IsScalar(), str(src, ": list items must be plain words"),
                       str("write e.g. ", spec.yaml_key(), ": [tensorboard, wandb]"));
      v.list.push_back(item.Scalar());
    }
    return v;
  }
  FSDP_USAGE_CHECK(
      false, str(src, ": expected a single value, got a ", node.IsSequence() ? "list" : "mapping"),
      str("keys are flat, one per flag: write ", spec.yaml_key(), ": <value>"));
  return v;
}

}  // namespace

std::vector<std::string> apply_yaml_text(const std::string& text, const std::string& source_name,
                                         TrainConfig* cfg) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    FSDP_USAGE_CHECK(
        false, str(where(source_name, e.mark), ": YAML syntax error: ", e.msg),
        "fix the file (keys are flag names with '_' or '-', e.g. learning_rate: 1e-4)");
  }
  std::vector<std::string> set;
  if (root.IsNull()) return set;  // an empty file sets nothing
  FSDP_USAGE_CHECK(root.IsMap(), str(source_name, ": the top level must be a mapping of keys"),
                   "write one 'key: value' line per option, e.g. learning_rate: 1e-4");
  std::map<std::string, std::string> spellings;  // option name -> key as written
  for (const auto& kv : root) {
    const std::string src0 = where(source_name, kv.first.Mark());
    FSDP_USAGE_CHECK(kv.first.IsScalar(), str(src0, ": keys must be plain words"),
                     "write one option per line as key: value (the flag names with _)");
    const std::string key = kv.first.Scalar();
    const OptionSpec* spec = key.rfind("--", 0) == 0 ? nullptr : find_option(key);
    if (spec == nullptr) {
      std::string guess = closest_option(key);
      std::replace(guess.begin(), guess.end(), '-', '_');
      // A section (key: followed by a nested map) is a layout other trainers use.
      FSDP_USAGE_CHECK(!kv.second.IsMap(), str(src0, ": unknown key '", key, "' holding a section"),
                       "the run file is flat, one key per option (learning_rate: 1e-4, not "
                       "optimizer: {lr: ...}); every key is listed in docs/configuration.md");
      FSDP_USAGE_CHECK(
          false, str(src0, ": unknown key '", key, "'"),
          str("did you mean '", guess, "'? Every key is listed in docs/configuration.md"));
    }
    const std::string src = str(src0, " ", spec->yaml_key());
    FSDP_USAGE_CHECK(!(spec->secret),
                     str(src0, ": '", key, "' may not be written in a configuration file"),
                     "keep secrets out of files: export WANDB_API_KEY instead");
    FSDP_USAGE_CHECK(!spec->cli_only, str(src0, ": '", key, "' is a command-line-only option"),
                     "pass it as a flag, e.g. --config FILE");
    // The spellings met so far, to name both in the message (max_steps twice, or max_steps and
    // max-steps).
    const auto first = spellings.emplace(spec->name, key);
    FSDP_USAGE_CHECK(first.second,
                     first.first->second == key ? str(src0, ": '", key, "' is given twice")
                                                : str(src0, ": '", key, "' is given twice (as ",
                                                      first.first->second, " and ", key, ")"),
                     "keep one of them");
    spec->set(*cfg, node_value(kv.second, *spec, src), src);
    set.push_back(spec->name);
  }
  return set;
}

std::vector<std::string> apply_yaml_file(const std::string& path, TrainConfig* cfg) {
  return apply_yaml_text(read_config_file(path), path, cfg);
}

std::string read_config_file(const std::string& path) {
  std::error_code ec;
  FSDP_USAGE_CHECK(!std::filesystem::is_directory(path, ec),
                   str("--config '", path, "' is a directory"),
                   "give the YAML run file itself (e.g. a run_config.yaml)");
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), str("--config '", path, "' cannot be read"),
                   "check the path of the YAML run file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

bool unquoted_kind(OptionKind k) {
  return k == OptionKind::kInt || k == OptionKind::kFloat || k == OptionKind::kBool ||
         k == OptionKind::kOptInt || k == OptionKind::kOptFloat;
}

bool saved(const OptionSpec& s) {
  return !s.secret && !s.cli_only;
}

std::string specforge_text(const TrainConfig& cfg) {
  std::string s;
  // Flags as typed ("--tp-size 1"), keys of SpecForge's typed schema as overrides
  // ("training.num_anchors=256").
  for (const auto& [name, value] : cfg.specforge_flags)
    s +=
        name.find('.') == std::string::npos ? " --" + name + " " + value : " " + name + "=" + value;
  return s;
}

}  // namespace

TrainConfig with_absolute_paths(const TrainConfig& cfg) {
  TrainConfig out = cfg;
  for (std::string* p :
       {&out.deepspeed_config, &out.model.target_model_path, &out.model.draft_model_config,
        &out.model.vocab_mapping_path, &out.model.init_checkpoint,
        &out.data.train_hidden_states_path, &out.data.eval_hidden_states_path,
        &out.data.train_data_path, &out.data.eval_data_path, &out.data.cache_dir,
        &out.checkpoint.output_dir, &out.checkpoint.resume_path, &out.metrics.tensorboard_dir,
        &out.metrics.wandb_dir, &out.profile.dir, &out.config_file}) {
    std::error_code ec;
    if (p->empty() || (*p)[0] == '/') continue;
    const auto abs = std::filesystem::absolute(*p, ec);
    if (!ec) *p = abs.lexically_normal().string();
  }
  return out;
}

std::string to_yaml(const TrainConfig& cfg) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string group;
  for (const auto& spec : option_table()) {
    // An option whose primary is off would be an error when the file is read back (--config
    // run_config.yaml): it means nothing, so it is left out.
    if (!saved(spec) || !spec.is_meaningful(cfg)) continue;
    if (spec.group != group) {
      // A comment after a value stays on its line: a blank line first puts it above the group.
      if (!group.empty()) out << YAML::Newline;
      group = spec.group;
      out << YAML::Comment(group);
    }
    const OptionValue v = spec.get(cfg);
    out << YAML::Key << spec.yaml_key() << YAML::Value;
    if (spec.kind == OptionKind::kList) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : v.list) out << item;
      out << YAML::EndSeq;
    } else if (v.is_null) {
      out << YAML::Null;
    } else if (unquoted_kind(spec.kind)) {
      out << v.text;
    } else {
      out << YAML::DoubleQuoted << v.text;
    }
  }
  out << YAML::EndMap;
  std::string text = std::string(out.c_str()) + "\n";
  // SpecForge flags without effect are command-line only: kept as a comment, not as keys.
  if (!cfg.specforge_flags.empty())
    text += "# SpecForge flags given (no effect):" + specforge_text(cfg) + "\n";
  return text;
}

std::string to_json(const TrainConfig& cfg, int indent) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& spec : option_table()) {
    if (!saved(spec)) continue;
    const OptionValue v = spec.get(cfg);
    auto& slot = j[spec.yaml_key()];
    if (spec.kind == OptionKind::kList) {
      slot = v.list;
    } else if (v.is_null) {
      slot = nullptr;
    } else if (spec.kind == OptionKind::kInt || spec.kind == OptionKind::kOptInt) {
      slot = detail::parse_int(v.text, spec.name);
    } else if (spec.kind == OptionKind::kFloat || spec.kind == OptionKind::kOptFloat) {
      slot = detail::parse_float(v.text, spec.name);
    } else if (spec.kind == OptionKind::kBool) {
      slot = v.text == "true";
    } else {
      slot = v.text;
    }
  }
  if (!cfg.specforge_flags.empty()) {
    auto& sf = j["specforge_flags"];
    for (const auto& [name, value] : cfg.specforge_flags) sf[name] = value;
  }
  return j.dump(indent);
}

std::string to_display(const TrainConfig& cfg) {
  std::ostringstream os;
  std::string group;
  for (const auto& spec : option_table()) {
    if (!saved(spec)) continue;
    if (spec.group != group) {
      group = spec.group;
      os << group << ":\n";
    }
    const OptionValue v = spec.get(cfg);
    std::string text = spec.kind == OptionKind::kList ? (v.list.empty() ? "none" : v.text)
                                                      : (v.text.empty() ? "\"\"" : v.text);
    os << "  " << spec.flag() << " " << text << "\n";
  }
  if (!cfg.specforge_flags.empty())
    os << "SpecForge flags (no effect):\n " << specforge_text(cfg) << "\n";
  return os.str();
}

std::string write_run_config(const TrainConfig& cfg) {
  const std::string path = checkpoint::join_path(cfg.checkpoint.output_dir, "run_config.yaml");
  const std::string tmp = checkpoint::join_path(cfg.checkpoint.output_dir, ".run_config.yaml.tmp");
  const std::string text = to_yaml(with_absolute_paths(cfg));
  const char* hint =
      "free space on the disk of --output-dir (or raise its quota or file size limit, or fix "
      "its permissions) and run again: nothing was trained yet";
  try {
    write_file_durably(tmp, text);
  } catch (const Error& e) {
    ::unlink(tmp.c_str());
    FSDP_USAGE_FAIL(str("cannot write ", path, ": ", e.message()), hint);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    FSDP_USAGE_CHECK(
        false, str("cannot write ", path, ": rename from ", tmp, " failed (", why, ")"), hint);
  }
  return path;
}

}  // namespace fsdp::config
