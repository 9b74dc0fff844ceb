// The discovery step (discover.h): the order of the lookups, nothing else.
#include "config/discovery/discover.h"

#include "config/discovery/draft_auto.h"
#include "config/discovery/hf_cache.h"

namespace fsdp::config {

std::vector<std::string> discover_inputs(TrainConfig* cfg) {
  // The target first: a draft config is made from the target's config.json.
  std::vector<std::string> notes;
  for (const std::string& note : {resolve_hub_target(cfg), generate_missing_draft_config(cfg)}) {
    if (!note.empty()) notes.push_back(note);
  }
  return notes;
}

}  // namespace fsdp::config
