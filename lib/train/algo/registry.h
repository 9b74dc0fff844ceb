// The draft families fsdp-train trains, each registered once by the architecture name its draft
// config carries (HF config.json "architectures"), and the factory the trainer calls once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/algo/algorithm.h"

namespace fsdp::algo {

struct Registration {
  std::string name;          // "eagle3", "dflash", "dspark" (SpecForge's training.strategy)
  std::string architecture;  // the draft config's architectures[0]
  std::unique_ptr<Algorithm> (*make)(const Context&);
};

// Every registered family, in a fixed order.
const std::vector<Registration>& registrations();

// The family a draft config file names (its single architectures entry). UsageError naming the
// file and the registered architectures when it names none of them; a file that cannot be read
// or has no architectures key goes to EAGLE3, whose parser names what is wrong.
const Registration& registration_for_draft_config(const std::string& path);

// The family of `name` (SpecForge's training.strategy), or nullptr.
const Registration* registration_named(const std::string& name);

// --strategy, when given, must name the family of the draft config (SpecForge's rule: a strategy
// requires its draft architecture): a UsageError naming both otherwise.
void check_strategy(const config::TrainConfig& cfg, const Registration& r);

// The algorithm of the run's draft config (its --strategy checked against it).
std::unique_ptr<Algorithm> make_algorithm(const Context& ctx);

}  // namespace fsdp::algo
