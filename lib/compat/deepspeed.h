// Translation of a DeepSpeed ds_config JSON into fsdp-train options (key by key in
// docs/migration-from-deepspeed.md): every known key is mapped, ignored or rejected, "auto" values
// are derived, and a report says what each key became. Never silently drops a key the user wrote.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace fsdp::config {

struct DeepSpeedContext {
  // The configuration before the ds_config is applied (defaults + YAML + flags), used to fill
  // "auto" values.
  const TrainConfig* base = nullptr;
  // Option names the user set explicitly (flags or YAML): a ds value that disagrees with one of
  // these is an error naming both.
  std::vector<std::string> explicit_options;
  int world_size = 0;                  // 0: unknown
  std::optional<int64_t> hidden_size;  // for h*h bucket sizes; unset: "n/a" in the report
};

struct DeepSpeedTranslation {
  // option name -> value, applied through the option table (source "<file> <json key>").
  std::vector<std::pair<std::string, OptionValue>> settings;
  std::map<std::string, std::string> setting_source;  // option name -> ds key it came from
  // One line per ds key: what it became; lines of ignored or approximated keys start with
  // "warning: " and are also listed (without the prefix) in `warnings`.
  std::vector<std::string> report;
  std::vector<std::string> warnings;
};

// Parses and translates; throws UsageError for unreadable JSON, NVMe offload, fp16 and values
// that contradict explicit options. `source_name` is the file name used in messages.
DeepSpeedTranslation translate_deepspeed_text(const std::string& json_text,
                                              const std::string& source_name,
                                              const DeepSpeedContext& ctx);
DeepSpeedTranslation translate_deepspeed_file(const std::string& path, const DeepSpeedContext& ctx);

}  // namespace fsdp::config
