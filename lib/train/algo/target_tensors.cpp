// The target's embedding and LM head (train/algo/target_tensors.h).
#include "train/algo/target_tensors.h"

#include <ATen/ATen.h>

#include <tuple>

#include "checkpoint/safetensors.h"
#include "checkpoint/target_keys.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/log.h"

namespace fsdp::algo {

TargetTensors read_target_tensors(const config::TrainConfig& cfg, const TargetShape& shape) {
  const int64_t V = shape.vocab_size, Ht = shape.hidden_size;
  // Only the embedding and the LM head are read out of the target checkpoint.
  const config::ModelConfig defaults;
  const checkpoint::TargetKeys keys = checkpoint::resolve_target_keys(
      cfg.model.target_model_path, {cfg.model.embedding_key, cfg.model.lm_head_key,
                                    cfg.model.embedding_key == defaults.embedding_key,
                                    cfg.model.lm_head_key == defaults.lm_head_key});
  if (!keys.note.empty())
    FSDP_LOG0(kInfo) << "target " << cfg.model.target_model_path << ": " << keys.note;
  auto target = checkpoint::read_model_tensors(
      cfg.model.target_model_path,
      keys.embedding_key == keys.lm_head_key
          ? std::vector<std::string>{keys.embedding_key}
          : std::vector<std::string>{keys.embedding_key, keys.lm_head_key});
  const at::Tensor& emb = target.at(keys.embedding_key);
  const at::Tensor& lmh = target.at(keys.lm_head_key);
  for (const auto& [key, t, flag] : {std::tuple{keys.embedding_key, emb, "--embedding-key"},
                                     std::tuple{keys.lm_head_key, lmh, "--lm-head-key"}}) {
    FSDP_USAGE_CHECK(t.dim() == 2 && t.size(0) == V && t.size(1) == Ht,
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               " has shape ", t.sizes(), ", the draft config (",
                               cfg.model.draft_model_config, ") needs [", V, ", ", Ht, "]"),
                     fsdp::str("check ", flag,
                               " and that vocab_size/hidden_size of the draft config "
                               "match the target model"));
    // An fp8 checkpoint keeps its scales in other tensors: a plain cast would be silently wrong.
    FSDP_USAGE_CHECK(t.scalar_type() != at::kFloat8_e4m3fn,
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               " is fp8 (F8_E4M3): a quantised checkpoint"),
                     "point --target-model-path at the bf16/fp16 checkpoint of the target model");
    // NaN/Inf here would give a draft that trains on garbage (or a NaN loss blamed on the
    // learning rate).
    FSDP_USAGE_CHECK(all_finite(t),
                     fsdp::str("target tensor '", key, "' in ", cfg.model.target_model_path,
                               t.is_floating_point()
                                   ? " contains NaN or Inf values"
                                   : fsdp::str(" is ", t.scalar_type(), ", not floating point")),
                     "the target checkpoint is damaged or not the model's weights; check it");
  }
  FSDP_USAGE_CHECK(
      Ht == shape.draft_hidden_size,
      fsdp::str("draft hidden_size ", shape.draft_hidden_size, " differs from the target's ", Ht,
                "; the draft embeds target tokens with the target embedding"),
      "set hidden_size in --draft-model-config to the target's hidden size");
  return TargetTensors{emb, lmh};
}

}  // namespace fsdp::algo
