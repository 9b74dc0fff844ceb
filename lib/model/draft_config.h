// The EAGLE3 draft model configuration (docs/reference.md §1.1): an HF LlamaConfig-style JSON as
// SpecForge users have it. Parsing lives in a torch-free TU; this header never includes JSON or
// torch. Never silently accept what the model cannot honour: bad values fail naming key and file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::model {

// RoPE frequency scaling as in HF transformers' rope_scaling dict.
enum class RopeType { kDefault, kLinear, kLlama3, kYarn };

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;
  // llama3: frequencies between the two wavelengths are interpolated smoothly.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: the context length the target was pre-trained with; 0 means
  // max_position_embeddings (yarn) and is an error for llama3.
  int64_t original_max_position_embeddings = 0;
  // yarn: correction range in rotations, optional attention temperature overrides.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  std::optional<double> attention_factor;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
};

std::string rope_type_name(RopeType t);

// The two EAGLE3 decoder-layer styles, named by the config's architectures: SpecForge's Llama
// layer, and the Qwen3 layer (an RMSNorm over each head of q and k before RoPE) that vLLM's
// qwen3_eagle3 model serves and speculators trains as --draft-arch qwen3.
inline constexpr const char* kEagle3LlamaArchitecture = "LlamaForCausalLMEagle3";
inline constexpr const char* kEagle3Qwen3Architecture = "Eagle3Qwen3ForCausalLM";
// transformers' Qwen3Config head_dim when the key is absent (what vLLM then builds).
inline constexpr int64_t kQwen3DefaultHeadDim = 128;

struct DraftConfig {
  std::vector<std::string> architectures{kEagle3LlamaArchitecture};
  // Qwen3 layers (architectures ["Eagle3Qwen3ForCausalLM"]): q_norm and k_norm, RMSNorm over
  // head_dim, on every layer's queries and keys before RoPE; model_type "qwen3" in the export.
  bool qk_norm = false;
  int64_t hidden_size = 0;                  // H (required)
  int64_t intermediate_size = 0;            // I (required)
  int64_t num_attention_heads = 0;          // nh (required)
  int64_t num_key_value_heads = 0;          // nkv (default nh)
  std::optional<int64_t> head_dim;          // d; absent means H / nh
  int64_t num_hidden_layers = 1;            // L decoder layers (docs/model.md "Draft variants")
  int64_t vocab_size = 0;                   // V (required)
  std::optional<int64_t> draft_vocab_size;  // Vd; absent or null means V
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  // Standard deviation of the normal initialisation (--draft-init normal); exported as given.
  double initializer_range = 0.02;
  RopeScaling rope_scaling;  // type kDefault when the key is null or absent
  std::string hidden_act = "silu";
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> target_hidden_size;  // Ht: fc input is n * this (default H)
  // n, the captured target layers fc reads: num_aux_hidden_states (vLLM's key) when given, else
  // the length of eagle_config's (or the top-level) eagle_aux_hidden_state_layer_ids, else 3.
  int64_t num_aux_hidden_states = 3;
  bool num_aux_hidden_states_given = false;  // the key was in the file (written back then)
  bool tie_word_embeddings = false;          // forced false (a warning is logged if true)
  // Draft variants (docs/model.md "Draft variants"), read from the top level or eagle_config (a
  // disagreement between the two is an error) and written back at the top level, where vLLM
  // reads them. fc_norm (EAGLE3.1): one RMSNorm per captured layer before fc. norm_before_fc:
  // one RMSNorm over the concatenated captured layers before fc (exclusive with fc_norm).
  // norm_output (EAGLE3.1, vLLM's and speculators' meaning): the final norm's output, not the
  // layer output, feeds the next TTT step. norm_before_residual: the first layer's residual is
  // the normed hidden state.
  bool fc_norm = false;
  bool norm_before_fc = false;
  bool norm_output = false;
  bool norm_before_residual = false;
  // The variant keys present in the file (written back even when false).
  std::vector<std::string> variant_keys_given;
  std::string torch_dtype = "bfloat16";
  // JSON text of values carried through untouched: eagle_config (empty = absent), the
  // original rope_scaling object (so unknown sub-keys survive), and every unknown key.
  std::string eagle_config_json;
  std::string rope_scaling_json;
  std::map<std::string, std::string> extra_json;
  // Where the config came from, used in error messages ("<string>" when parsed from text).
  std::string source = "<string>";

  int64_t head_dim_value() const {
    return head_dim ? *head_dim : hidden_size / num_attention_heads;
  }
  int64_t draft_vocab() const { return draft_vocab_size ? *draft_vocab_size : vocab_size; }
  int64_t target_hidden() const { return target_hidden_size ? *target_hidden_size : hidden_size; }
  int64_t fc_in_features() const { return num_aux_hidden_states * target_hidden(); }
  int64_t q_out_features() const { return num_attention_heads * head_dim_value(); }
  int64_t kv_out_features() const { return num_key_value_heads * head_dim_value(); }

  // Throws fsdp::UsageError naming the key and `source` for anything the model cannot run.
  void validate() const;
  // Pretty-printed JSON for config.json in checkpoints: every known key, eagle_config and the
  // unknown keys carried through, the architecture as given (model_type "qwen3" for Qwen3 layers),
  // tie_word_embeddings false and draft_vocab_size always written.
  std::string to_json() const;
};

// Reads and validates a draft config file; errors name the file and the key.
DraftConfig load_draft_config(const std::string& path);
// Same from JSON text; `source` names the input in error messages.
DraftConfig parse_draft_config(const std::string& json_text,
                               const std::string& source = "<string>");

// Parameter counts implied by a config (closed form, no module needed): used for logging,
// MFU and the reference's headline numbers (docs/reference.md §9).
struct ParamCounts {
  int64_t trainable = 0;         // fc (and its norms), the decoder layers, norm, lm_head
  int64_t frozen_embedding = 0;  // embed_tokens [V,H]
  int64_t buffers = 0;           // d2t [Vd] + t2d [V] elements
};
ParamCounts count_parameters(const DraftConfig& cfg);

}  // namespace fsdp::model
