// The DSpark keys of a draft config.json: the Markov head (a low-rank logit bias from the
// previous token; vanilla, gated or rnn), the confidence head and the DSpark-only attention rule,
// as SpecForge 0.2.0's DSparkDraftModel reads them. Torch-free (parsing in a JSON TU of its own);
// the DFlash backbone's keys (layers, target_layer_ids, block_size, mask token) are not read here.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::model {

// The Markov head's variant (SpecForge's markov_head_type, lower-cased).
enum class MarkovHeadType { kVanilla, kGated, kRnn };
std::string markov_head_type_name(MarkovHeadType t);

struct DSparkHeadsConfig {
  int64_t vocab_size = 0;   // V (top level, required): markov_w1 rows and markov_w2 outputs
  int64_t hidden_size = 0;  // H (top level, required): the backbone's output width
  // markov_rank r: 0 (the default; null reads 0) means no Markov head, the base logits unchanged.
  int64_t markov_rank = 0;
  MarkovHeadType markov_head_type = MarkovHeadType::kVanilla;  // only read with r > 0
  // confidence_head_alpha of dflash_config: only the default of enable_confidence_head (> 0 turns
  // it on); the training weight of the confidence loss is the trainer's
  // dspark_confidence_head_alpha.
  double confidence_head_alpha = 0.0;
  bool enable_confidence_head = false;
  // The confidence head reads [hidden, markov_w1(prev token)] (H + r inputs) instead of hidden.
  bool confidence_head_with_markov = false;
  // dflash_config.attention_mode: "gqa" (default; num_key_value_heads < num_attention_heads) or
  // "mha" (equal counts), checked against the top-level head counts as DSparkDraftModel does.
  std::string attention_mode = "gqa";
  double initializer_range = 0.02;  // std of the normal initialisation (HF's _init_weights)
  std::string source = "<string>";  // where the config came from, for error messages

  bool has_markov_head() const { return markov_rank > 0; }
  // The confidence head's input width: H, or H + r with confidence_head_with_markov.
  int64_t confidence_input_dim() const {
    return hidden_size + (confidence_head_with_markov ? markov_rank : 0);
  }
  // Throws fsdp::UsageError naming the key and `source` for anything the heads cannot run.
  void validate() const;
  // The head keys as JSON object text: markov_rank, markov_head_type, enable_confidence_head,
  // confidence_head_with_markov. SpecForge reads them in dflash_config, vLLM at the top level:
  // an export writes them at both places (the parser accepts that when they agree).
  std::string keys_json() const;
};

// Today's state-dict name of a DSpark head tensor: early SpecForge DSpark checkpoints kept the
// heads under logit_head. (logit_head.markov_head.*, logit_head.confidence_head.*, and
// logit_head.prefix_gru.* / logit_head.embed_proj.*, which SpecForge 0.2.0 maps to prefix_gru.* /
// embed_proj.* but whose modules it no longer has); every other name is returned unchanged.
std::string dspark_state_dict_name(const std::string& key);

// Reads the DSpark keys from draft config JSON text. Where SpecForge reads them (dflash_config)
// they win; a key only at the top level (vLLM's and speculators' spelling, where vLLM's
// qwen3_dspark loader reads markov_rank, markov_head_type, enable_confidence_head and
// confidence_head_with_markov) is read from there; the two spellings disagreeing is an error.
// dflash_config.projector_type must be absent or "dspark". Errors name the key and `source`.
DSparkHeadsConfig parse_dspark_heads_config(const std::string& json_text,
                                            const std::string& source = "<string>");
// The same from a file; errors name the file.
DSparkHeadsConfig load_dspark_heads_config(const std::string& path);

}  // namespace fsdp::model
