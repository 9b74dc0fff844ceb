// SpecForge's typed run configuration (`specforge train -c run.yaml section.key=value`): a YAML
// file of sections (model, data, training, tracking, profiling, runtime, deployment) plus run_id
// and output_dir, with unknown keys an error. `fsdp-train --config run.yaml [section.key=value
// ...]` reads it through the table in specforge_schema.cpp: every key of SpecForge's schema is
// listed there with its type, SpecForge's default and what fsdp-train does with it (sets an
// option of the table, is recorded with no effect, or is refused with the reason). The keys that
// take effect get SpecForge's defaults when the file does not give them, and a typed file also
// selects the semantics of SpecForge's new trainer (docs/migration-from-specforge.md).
#pragma once

#include <string>
#include <vector>

#include "config/train_config.h"

namespace fsdp::config {

// What fsdp-train does with one key of SpecForge's schema.
enum class SchemaUse {
  kSets,      // sets the option(s) named in `effect` (SpecForge's default when not given)
  kRecorded,  // accepted and type-checked, recorded in the run metadata, no effect
  kRefused,   // refused when it differs from SpecForge's default (the reason says why)
};

// One row of the key table, as docs/migration-from-specforge.md shows it.
struct SchemaKeyDoc {
  std::string path;          // "training.learning_rate"
  std::string type;          // "float > 0", "bool", "one of cosine, constant", ...
  std::string default_text;  // SpecForge's default ("1e-4", "null", "required")
  SchemaUse use;
  std::string effect;  // what fsdp-train does with it
};
const std::vector<SchemaKeyDoc>& specforge_schema_keys();
// The generated key table of docs/migration-from-specforge.md (unit test config.docs checks it).
std::string specforge_schema_markdown();

// The outcome of reading a typed file.
struct SchemaLoad {
  std::vector<std::string> set_options;  // option names the file (or an override) gave a value
  std::vector<std::string> report;       // start-up lines: recorded keys and their reasons
  // batch_size and accumulation_steps are per rank: the global batch is batch_size x ranks x
  // accumulation_steps (resolve() derives it from the world size).
  bool per_rank_batch = true;
};

namespace detail {
// True when `text` parses as YAML whose top level holds one of SpecForge's sections as a
// mapping (model:, data:, training:, ...): fsdp-train's own run files are flat.
bool is_specforge_schema_text(const std::string& text);
// Applies a typed file (already read) and its dotted overrides to `cfg`. Throws UsageError
// naming the file and line, or the override, and the key. `world_size` (0: unknown) is checked
// against deployment.trainer (a warning line in the report when they differ).
SchemaLoad apply_specforge_schema(const std::string& text, const std::string& source_name,
                                  const std::vector<std::string>& overrides, int world_size,
                                  TrainConfig* cfg);
}  // namespace detail

}  // namespace fsdp::config
