// The draft-family registry (train/algo/registry.h). Adding a family: one row here.
#include "train/algo/registry.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "train/algo/dflash.h"
#include "train/algo/dspark.h"
#include "train/algo/eagle3.h"
#include "train/algo/peagle.h"

namespace fsdp::algo {
namespace {

template <typename T>
std::unique_ptr<Algorithm> make_one(const Context& ctx) {
  return std::make_unique<T>(ctx);
}

// The single architectures entry of a JSON file; "" when it cannot be told.
std::string architecture_of(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("architectures")) return {};
  const auto& a = j.at("architectures");
  if (!a.is_array() || a.size() != 1 || !a[0].is_string()) return {};
  return a[0].get<std::string>();
}

}  // namespace

const std::vector<Registration>& registrations() {
  static const std::vector<Registration> all = {
      {"eagle3", "LlamaForCausalLMEagle3", &make_one<Eagle3>},
      {"eagle3", "Eagle3Qwen3ForCausalLM", &make_one<Eagle3>},  // EAGLE3 with Qwen3 layers
      {"dflash", "DFlashDraftModel", &make_one<DFlash>},
      {"dspark", "DSparkDraftModel", &make_one<DSpark>},
      {"peagle", "PEagleDraftModel", &make_one<PEagle>},
  };
  return all;
}

const Registration& registration_for_draft_config(const std::string& path) {
  const std::string arch = architecture_of(path);
  for (const auto& r : registrations())
    if (r.architecture == arch) return r;
  if (arch.empty()) return registrations().front();
  std::string known;
  for (const auto& r : registrations())
    known += fsdp::str(known.empty() ? "" : ", ", r.architecture, " (", r.name, ")");
  FSDP_USAGE_FAIL(fsdp::str("draft config ", path, ": architectures [\"", arch,
                            "\"] is not a draft fsdp-train trains"),
                  fsdp::str("use a draft config of one of: ", known));
}

const Registration* registration_named(const std::string& name) {
  for (const auto& r : registrations())
    if (r.name == name) return &r;
  return nullptr;
}

void check_strategy(const config::TrainConfig& cfg, const Registration& r) {
  if (!cfg.strategy) return;
  const std::string name = config::to_string(*cfg.strategy);
  if (name == r.name) return;
  const Registration* wanted = registration_named(name);
  FSDP_USAGE_FAIL(
      fsdp::str("--strategy ", name, " (SpecForge's training.strategy), but the draft config ",
                cfg.model.draft_model_config, " is a ", r.architecture, " (the ", r.name,
                " family)"),
      wanted ? fsdp::str("give a ", wanted->architecture, " draft config, or --strategy ", r.name)
             : fsdp::str("fsdp-train does not train ", name, " drafts yet: give --strategy ",
                         r.name, " or leave it out"));
}

std::unique_ptr<Algorithm> make_algorithm(const Context& ctx) {
  const Registration& r = registration_for_draft_config(ctx.cfg->model.draft_model_config);
  check_strategy(*ctx.cfg, r);
  return r.make(ctx);
}

}  // namespace fsdp::algo
