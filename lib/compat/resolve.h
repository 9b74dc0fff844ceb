// Building the TrainConfig from every layer a user can give, in order of precedence: defaults <
// --config file (fsdp-train's run file or SpecForge's typed schema) < --deepspeed ds_config <
// command-line flags (a ds_config value that disagrees with a flag or file key is an error).
// The order lives here because two of the layers are other tools' configurations; every layer
// writes through the option table (config/options.h). Never validates the whole configuration.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace fsdp::config {

struct ResolveOptions {
  // Data-parallel size, for ds_config batch arithmetic ("auto" train_batch_size); 0 = unknown.
  int world_size = 0;
  // Draft hidden size for ds_config "auto" bucket sizes; unset: read hidden_size from
  // --draft-model-config when that file exists.
  std::optional<int64_t> hidden_size;
  // Receives the ds_config translation report, one line per key, warnings prefixed with
  // "warning: " (print them on rank 0). nullptr: resolve() logs them on rank 0.
  std::vector<std::string>* report = nullptr;
};

// Builds the configuration from the layers above, with the discovery step (config/discovery/
// discover.h) between the flags and the ds_config (whose "auto" sizes read the draft config it
// may make). A ds_config value that contradicts an explicitly given flag or YAML key is an error
// naming both. Does not validate the whole configuration: call validate() next.
TrainConfig resolve(const CommandLineValues& cli, const ResolveOptions& options = {});

}  // namespace fsdp::config
