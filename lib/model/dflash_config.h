// The block-draft configuration of DFlash and DSpark (docs/block-drafts.md): a Qwen3-style
// config.json (architectures DFlashDraftModel or DSparkDraftModel) with block_size, the target
// layers whose features the draft reads (dflash_config.target_layer_ids), the mask token and the
// per-layer attention layout. The Llama/Qwen3 core keys (sizes, norm epsilon, RoPE) are read by
// the shared draft-config parser (model/draft_config.h), so their rules and messages are one.
// Torch-free; bad values fail naming the key and the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/draft_config.h"

namespace fsdp::model {

enum class BlockAttention { kFull, kSliding };

struct DFlashConfig {
  std::string architecture;  // "DFlashDraftModel" or "DSparkDraftModel"
  // hidden_size, intermediate_size, heads, head_dim (Qwen3's default 128 when absent),
  // num_hidden_layers, vocab_size, rms_norm_eps, max_position_embeddings, RoPE.
  DraftConfig core;
  int64_t block_size = 0;  // tokens per block: the anchor and block_size - 1 predictions
  std::optional<int64_t> num_target_layers;
  // 0-based target layer outputs whose hidden states are concatenated into the features
  // (hidden_states[id + 1] of the target's output_hidden_states).
  std::vector<int64_t> target_layer_ids;
  std::optional<int64_t> mask_token_id;  // dflash_config.mask_token_id
  std::vector<BlockAttention> layer_types;
  std::optional<int64_t> sliding_window;  // set when any layer slides
  bool attention_bias = false;
  std::string json_text;  // the file as read, for the export (keys carried through)
  std::string source = "<string>";

  int64_t hidden_size() const { return core.hidden_size; }
  int64_t num_layers() const { return core.num_hidden_layers; }
  int64_t head_dim() const { return core.head_dim_value(); }
  int64_t fc_in_features() const {
    return static_cast<int64_t>(target_layer_ids.size()) * core.hidden_size;
  }
  // The mask token, or a UsageError naming the file when the config has none.
  int64_t require_mask_token() const;
};

// SpecForge's default target layers for a draft of num_draft_layers layers over a target of
// num_target_layers: one evenly spread set from layer 1 to num_target_layers - 3.
std::vector<int64_t> default_target_layer_ids(int64_t num_target_layers, int64_t num_draft_layers);

DFlashConfig parse_dflash_config(const std::string& json_text,
                                 const std::string& source = "<string>");
DFlashConfig load_dflash_config(const std::string& path);

}  // namespace fsdp::model
