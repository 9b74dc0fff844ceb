// A --config file of either kind: fsdp-train's flat run file (config/options.h, apply_yaml_text)
// or SpecForge's typed schema (compat/specforge_schema.h). This file only recognises which one a
// file is and hands it to its reader; it never maps a key itself.
#pragma once

#include <string>
#include <vector>

#include "config/options.h"

namespace fsdp::config {

// A --config file of either kind: fsdp-train's flat run file, or SpecForge's typed schema
// (sections model, data, training, ...; specforge_schema.h), which also takes `overrides`.
struct ConfigFileLoad {
  std::vector<std::string> set_options;  // option names the file or its overrides set
  std::vector<std::string> report;       // start-up lines (typed schema: the recorded keys)
  bool specforge_schema = false;
};
// `world_size` (0: unknown) is checked against a typed file's deployment.trainer.
ConfigFileLoad load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                                TrainConfig* cfg, int world_size = 0);
ConfigFileLoad load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides, TrainConfig* cfg,
                                int world_size = 0);

}  // namespace fsdp::config
