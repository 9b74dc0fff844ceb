// A draft config made from the target's config.json when --draft-model-config is not given, as
// SpecForge does: its llama3-8B-eagle3 template with the target's sizes copied in. Never reads
// tensors; never changes a config the user gave.
#pragma once

#include <string>

namespace fsdp::config {

struct TrainConfig;

// The draft config (JSON text) SpecForge's generate_draft_model_config would make from a target
// config.json's text: the llama3-8B-eagle3 template (configs/models/llama3-8B-eagle3.json) with
// vocab_size, hidden_size, num_attention_heads, num_key_value_heads (absent: the attention
// heads, as Hugging Face's Llama config does), intermediate_size, max_position_embeddings,
// rms_norm_eps, hidden_act, bos/eos_token_id and torch_dtype (or dtype) taken from the target
// (from its text_config when the top level has no hidden_size: multimodal checkpoints);
// num_hidden_layers 1, tie_word_embeddings false; head_dim left to hidden_size / heads as in
// SpecForge, except where that is odd or not whole (gpt-oss) and the target has a head_dim;
// draft_vocab_size the template's 32000, or vocab_size when that is smaller. `source` names the
// file in errors (fsdp::UsageError).
std::string draft_config_from_target(const std::string& target_config_text,
                                     const std::string& source);

// The draft config `specforge train` makes (--auto-draft-config target): the target's (or its
// text_config's) vocab (padded_vocab_size first), hidden, head, MLP, position, norm, activation,
// initializer_range, attention_bias/dropout, head_dim, RoPE (rope_theta, rope_scaling,
// rope_parameters), token-id and sliding-window fields copied as they are, over no template;
// LlamaForCausalLMEagle3, one layer, pad_token_id 0 when absent, draft_vocab_size 32000 or the
// vocabulary when that is smaller.
std::string draft_config_from_target_fields(const std::string& target_config_text,
                                            const std::string& source);

// The template above, as embedded in the binary (a test keeps it equal to the file).
const std::string& draft_config_template();

// When cfg has a target but no draft config: uses the config.json of the checkpoint the run
// continues (--resume PATH, or the newest complete checkpoint of --output-dir for --resume
// auto) or starts from (--init-checkpoint) when there is one; else writes
// draft_config_from_target(<target>/config.json) to <cache-dir>/draft_configs/<target dir
// name>-eagle3-auto-<content hash>.json (atomically; the name depends on the content, so concurrent
// ranks and runs never disagree), sets cfg->model.draft_model_config to it and returns a line
// saying so; else (also when the target has no readable config.json: validate() then asks for
// --draft-model-config) changes nothing and returns "". A config.json without sizes, or an
// unwritable cache, throws fsdp::UsageError naming the path.
std::string generate_missing_draft_config(TrainConfig* cfg);

}  // namespace fsdp::config
