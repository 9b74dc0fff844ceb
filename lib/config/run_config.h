// run_config.yaml, the effective configuration saved in --output-dir at the start of a run
// (docs/usage.md): written so that a full disk or a quota is an error naming the file at once,
// never an empty or cut file found later. Declared apart from options.h (which most of the
// trainer includes) to keep it a small dependency.
#pragma once

#include <string>

#include "config/train_config.h"

namespace fsdp::config {

// Writes to_yaml(with_absolute_paths(cfg)) to <--output-dir>/run_config.yaml: to a temporary
// file first (every write, the fsync and the close checked), then renamed over the old one, so
// the file is either the previous one or the complete new one. Any failure (ENOSPC, EFBIG, a
// read-only directory) throws UsageError (exit code 2) naming the file and the reason, with the
// temporary file removed. Returns the path written.
std::string write_run_config(const TrainConfig& cfg);

}  // namespace fsdp::config
