// The P-EAGLE draft config (docs/model.md "P-EAGLE"): SpecForge 0.2.0's PEagleDraftModel config,
// an HF LlamaConfig with architectures ["PEagleDraftModel"]. Its decoder, fc and head keys are the
// EAGLE3 draft's (model/draft_config.h parses and checks them); what P-EAGLE adds is the mask
// token its depths >= 1 read. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "model/draft_config.h"

namespace fsdp::model {

inline constexpr const char* kPEagleArchitecture = "PEagleDraftModel";

struct PEagleConfig {
  // The EAGLE3 draft the P-EAGLE draft is built from (architectures as the shared parser's own).
  DraftConfig core;
  // The token id depths >= 1 embed: the config's top-level mask_token_id (vLLM's P-EAGLE loader
  // reads it there), else dflash_config.mask_token_id (SpecForge's draft-config place); --mask-
  // token-id (SpecForge's model.mask_token_id) overrides both. Absent: the trainer must be told.
  std::optional<int64_t> mask_token_id;
  std::string source = "<string>";

  // config.json of an export: the file's keys, architectures ["PEagleDraftModel"], the core's
  // normalised values and mask_token_id at the top level.
  std::string to_json() const;
};

// Errors name the file and the key: another architecture, EAGLE3 variants P-EAGLE does not build
// (fc_norm, norm_before_fc, norm_output, Qwen3 layers), a mask token outside the vocabulary.
PEagleConfig parse_peagle_config(const std::string& json_text, const std::string& source);
PEagleConfig load_peagle_config(const std::string& path);

}  // namespace fsdp::model
