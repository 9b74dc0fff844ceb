// The serving contract of the block drafts, DFlash and DSpark (docs/serving.md "DFlash" and
// "DSpark"): the config.json an export carries (which keys each engine reads, and where), the
// tensors it holds with the shapes the config implies, and how many tokens the engines draft per
// step. The one owner of these rules: the export writer, `check-export` and the serving test ask
// it. Torch-free and file-free; it never writes.
//
// The rules, as vLLM 0.32 (model_executor/models/qwen3_dflash.py, qwen3_dspark.py,
// config/speculative.py, v1/spec_decode/dflash.py) and SGLang (srt/models/dflash.py, dspark.py,
// speculative/dflash_utils.py, dspark_components/dspark_config.py) read them:
// - architectures: DFlashDraftModel (both engines); DSparkDraftModel, which vLLM serves as its
//   Qwen3DSparkModel only with model_type "qwen3" (any other model_type sends it down the
//   DeepSeek-V4 DSpark path); Qwen3DSparkModel is read by both engines.
// - dflash_config.target_layer_ids: SpecForge's ids, layer outputs (hidden_states[i + 1]); vLLM
//   captures hidden_states[i + 1] unless eagle_aux_hidden_state_layer_ids is given, SGLang checks
//   the ids against num_target_layers (without it, against the draft's own layer count).
// - dflash_config.mask_token_id: the token of the block's mask slots, embedded with the target's
//   embedding (both engines).
// - fc reads len(target_layer_ids) x hidden_size features (SGLang; vLLM reads target_hidden_size
//   when given); the embedding and the LM head are the target's, so hidden_size and vocab_size
//   are the target's.
// - DSpark's heads: vLLM reads markov_rank, enable_confidence_head and
//   confidence_head_with_markov at the top level only (its defaults: no confidence head, without
//   the Markov embedding); SGLang reads markov_rank and markov_head_type at the top level (or in
//   dspark_config), never in dflash_config, and defaults confidence_head_with_markov to
//   markov_rank > 0. SpecForge 0.2.0 reads all of them in dflash_config only. The export writes
//   both places.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/serving_contract.h"

namespace fsdp::checkpoint {

enum class BlockDraftKind { kDFlash, kDSpark };

// The kind a config's architectures name (DFlashDraftModel; DSparkDraftModel or
// Qwen3DSparkModel); nullopt for any other draft.
std::optional<BlockDraftKind> block_draft_kind(const nlohmann::json& cfg);
const char* block_draft_kind_name(BlockDraftKind kind);  // "DFlash", "DSpark"
// The architecture the export writes: SpecForge's names, DFlashDraftModel and DSparkDraftModel.
const char* block_draft_architecture(BlockDraftKind kind);

// Tokens an engine drafts per step for a draft trained with blocks of `block_size`: DFlash's
// block [anchor, mask x (B - 1)] predicts the B - 1 masked tokens (vLLM num_speculative_tokens
// B - 1); DSpark's anchor predicts too, labels anchor + 1 .. anchor + B (vLLM's default
// num_speculative_tokens B, its sample_from_anchor layout; SGLang's gamma B).
int64_t engine_draft_tokens(BlockDraftKind kind, int64_t block_size);

// The engines that can serve the draft as trained: both, but SGLang alone for a DSpark Markov
// head other than vanilla (vLLM 0.32's Qwen3DSparkModel builds only the vanilla head), vLLM
// alone for a DSpark draft without a Markov head (markov_rank 0: SGLang refuses it).
ServingEngines block_draft_engines(const nlohmann::json& export_config);

// What training adds to the draft config when it exports.
struct BlockDraftTraining {
  std::string source;                     // the draft config's path (messages)
  std::vector<int64_t> target_layer_ids;  // SpecForge's ids (layer outputs) of the features
  int64_t mask_token_id = -1;             // resolved as SpecForge does
  int64_t target_num_layers = 0;          // num_hidden_layers of the target
  int64_t target_vocab_size = 0;          // 0: unknown (not checked)
  int64_t target_hidden_size = 0;         // 0: unknown (not checked)
  std::string torch_dtype = "bfloat16";   // of the exported weights
};

// The export's config.json from the parsed draft config (SpecForge's DFlash/DSpark config: a
// Qwen3Config with block_size, layer_types, dflash_config) and what training adds: every key
// the engines read written explicitly where each engine reads it (the rules above), the draft
// config's other keys kept. Throws fsdp::UsageError naming `training.source` and the key when
// the draft cannot be exported as one the engines serve as trained (a missing or malformed
// size, ids outside the target, a mask token outside the vocabulary, a vocabulary or width other
// than the target's, a DSpark head key given differently at the top level and in dflash_config,
// layer_types of the wrong length, no num_key_value_heads, use_sliding_window without layer_types).
// An absent head_dim is Qwen3Config's 128, written out.
nlohmann::json block_draft_export_config(const nlohmann::json& draft_config,
                                         const BlockDraftTraining& training);

// One tensor of the export: its name as SpecForge 0.2.0's DFlashDraftModel / DSparkDraftModel
// state dict spells it (the engines read these names; vLLM adds its own "model." prefix).
struct BlockDraftTensor {
  std::string name;
  std::vector<int64_t> shape;
};
// Every tensor an export of this config holds, in a fixed order: fc, hidden_norm, each layer's
// attention (q/k/v/o, with biases when attention_bias, q_norm, k_norm), MLP and norms, norm; for
// DSpark the Markov head when markov_rank r > 0 (markov_w1 [V, r], markov_w2 [V, r], and
// gate_proj or joint_proj with biases for the gated and rnn heads) and the confidence head when
// enabled. No embedding, no LM
// head, no d2t/t2d: the engines take the target's. Throws fsdp::UsageError naming the key when
// the config lacks a size. Absent head_dim and num_key_value_heads are Qwen3Config's defaults
// (128, 32), as SpecForge and the engines read them.
std::vector<BlockDraftTensor> block_draft_layout(const nlohmann::json& export_config);

}  // namespace fsdp::checkpoint
