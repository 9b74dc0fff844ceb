// Which tensors of a Hugging Face target checkpoint hold the token embedding and the LM head.
// Real checkpoints differ from the Llama names: tied-embedding models (SmolLM2, Qwen3 0.6-4B,
// Llama 3.2 1B/3B) store no lm_head tensor, and multimodal ones nest the language model under a
// prefix. Reads only the weight map and config.json; never reads tensor data.
#pragma once

#include <string>

namespace fsdp::checkpoint {

struct TargetKeyRequest {
  std::string embedding_key;  // the name asked for (--embedding-key)
  std::string lm_head_key;    // the name asked for (--lm-head-key)
  // A name may be replaced only when it is the default (the caller compares with the default
  // value, so the default given explicitly counts as the default): any other name the
  // checkpoint lacks is an error, never a guess.
  bool embedding_is_default = true;
  bool lm_head_is_default = true;
};

struct TargetKeys {
  std::string embedding_key, lm_head_key;
  std::string note;  // why a name differs from the request (empty when none does), for the log
};

// Resolves the two names in `model_dir`:
//  - a name present in the checkpoint is used as given;
//  - a missing default name is replaced by the one tensor whose name ends with it after a
//    prefix (".embed_tokens.weight", ".lm_head.weight"), e.g. "language_model.lm_head.weight";
//  - a missing default LM head with no such tensor is the embedding when config.json's
//    tie_word_embeddings (or text_config's) is true; absent is not enough (the default differs
//    between model classes: Llama's is false), so that is an error;
//  - anything else throws fsdp::UsageError naming the directory, the name and the candidates.
TargetKeys resolve_target_keys(const std::string& model_dir, const TargetKeyRequest& request);

}  // namespace fsdp::checkpoint

namespace fsdp::checkpoint {

// The target's final RMSNorm (what a dump that stores the last hidden state before the norm,
// such as speculators', needs applied before the LM head): the one tensor named norm.weight
// outside the decoder layers ("model.norm.weight", "model.language_model.norm.weight", ...), and
// rms_norm_eps of config.json (top level, else text_config). Throws UsageError naming the
// directory when either is missing or the name is ambiguous.
struct FinalNormSpec {
  std::string key;
  double eps = 0;
};
FinalNormSpec resolve_final_norm(const std::string& model_dir);

}  // namespace fsdp::checkpoint
