// The projections of a draft decoder layer that can carry a LoRA adapter (--lora-targets), a
// closed set named as the layer's modules and PEFT's target_modules name them. Torch-free and
// header-only: the option table parses the flag into these once, the draft and the export use
// the names.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::model {

enum class LoraTarget { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };

inline constexpr std::array<const char*, 7> kLoraTargetNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// "q_proj", ...: the module's name in the decoder layer.
inline const char* lora_target_name(LoraTarget t) {
  return kLoraTargetNames[static_cast<size_t>(t)];
}

// Every target, in PEFT's usual order (the default of --lora-targets).
inline const std::vector<LoraTarget>& all_lora_targets() {
  static const std::vector<LoraTarget> all = {
      LoraTarget::kQProj,    LoraTarget::kKProj,  LoraTarget::kVProj,   LoraTarget::kOProj,
      LoraTarget::kGateProj, LoraTarget::kUpProj, LoraTarget::kDownProj};
  return all;
}

// The target named `name` exactly; nullopt for anything else.
inline std::optional<LoraTarget> parse_lora_target(const std::string& name) {
  for (size_t i = 0; i < kLoraTargetNames.size(); ++i)
    if (name == kLoraTargetNames[i]) return static_cast<LoraTarget>(i);
  return std::nullopt;
}

// The names of `targets`, in their order (PEFT's target_modules, messages).
inline std::vector<std::string> lora_target_names(const std::vector<LoraTarget>& targets) {
  std::vector<std::string> out;
  for (LoraTarget t : targets) out.emplace_back(lora_target_name(t));
  return out;
}

}  // namespace fsdp::model
