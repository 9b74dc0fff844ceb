// The DFlash block draft (docs/block-drafts.md): Qwen3-style decoder layers that predict a
// block of tokens at once. The target's features at several layers, concatenated, pass through
// fc and hidden_norm and enter every layer as extra keys/values (context); the block's own
// positions (the anchor's embedding, then mask-token embeddings) are the queries and further
// keys/values. A query sees the context strictly before its block's anchor and every position
// of its own block (a sliding layer: the last sliding_window - 1 context positions before its
// own, and the block's positions up to its own). State-dict names are SpecForge's and vLLM's
// (layers.<k>.self_attn.{q,k,v,o}_proj, .q_norm, .k_norm, .mlp.{gate,up,down}_proj,
// .input_layernorm, .post_attention_layernorm, fc, hidden_norm, norm). The target's embedding
// and LM head are not part of it (the caller holds them, frozen). Knows nothing about
// distribution: it names its units through fsdp::UnitHooks.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "core/unit_hooks.h"
#include "model/dflash_config.h"
#include "model/draft_model.h"
#include "model/rope.h"

namespace fsdp::model {

// Where a micro-batch's blocks sit: anchors int64 [B, N] (position of each block's first token;
// 0 for a dropped block), keep bool [B, N] (false: padding block, attends nothing, output 0),
// over a context of context_len positions.
struct BlockLayout {
  at::Tensor anchors;
  at::Tensor keep;
  int64_t context_len = 0;
  int64_t block_size = 0;
  int64_t num_blocks() const { return anchors.size(1); }
};

class DFlashAttentionImpl : public torch::nn::Module {
 public:
  DFlashAttentionImpl(const DFlashConfig& cfg, int64_t layer);
  // x [B, Q, H] (Q = N * block_size), ctx [B, S, H]; cos/sin [B, S + Q, d] for the context
  // positions then the block positions. Returns [B, Q, H].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& ctx, const at::Tensor& cos,
                     const at::Tensor& sin, const BlockLayout& layout);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  int64_t num_heads, num_kv_heads, head_dim;
  std::optional<int64_t> sliding_window;  // set on a sliding_attention layer
};
TORCH_MODULE(DFlashAttention);

class DFlashLayerImpl : public torch::nn::Module {
 public:
  DFlashLayerImpl(const DFlashConfig& cfg, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& ctx, const at::Tensor& cos,
                     const at::Tensor& sin, const BlockLayout& layout);
  RMSNorm input_layernorm{nullptr};
  DFlashAttention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Eagle3MLP mlp{nullptr};
};
TORCH_MODULE(DFlashLayer);

// Units announced through the hooks (unit_names()): fc, hidden_norm, layers.0 .. layers.L-1,
// norm. Parameters are created in fp32 (PyTorch's Linear init); ->to(dtype) for compute.
class DFlashDraftImpl : public torch::nn::Module {
 public:
  explicit DFlashDraftImpl(const DFlashConfig& cfg);
  const DFlashConfig& config() const { return cfg_; }
  void set_unit_hooks(fsdp::UnitHooks* hooks) { hooks_ = hooks; }
  std::vector<std::string> unit_names() const;
  // Hugging Face's post_init (what SpecForge's drafts start from): every Linear weight drawn
  // from N(0, std) in named_parameters() order, biases zero, norms one.
  void normal_init(double std);

  // noise [B, Q, H]: the block tokens' embeddings (target embedding of the anchor, then of the
  // mask token); target_hidden [B, S, n * H]: the features of the target layers. Returns the
  // final norm's output [B, Q, H], zero rows for dropped blocks' positions before the norm.
  at::Tensor forward(const at::Tensor& noise, const at::Tensor& target_hidden,
                     const BlockLayout& layout);

  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear fc{nullptr};
  RMSNorm hidden_norm{nullptr}, norm{nullptr};

 private:
  // cos/sin [B, S + Q, d] in `dtype`: positions 0..S-1, then anchor + offset per block token.
  std::pair<at::Tensor, at::Tensor> positions(const BlockLayout& layout, c10::ScalarType dtype,
                                              c10::Device device);
  DFlashConfig cfg_;
  RotaryEmbedding rope_;
  fsdp::UnitHooks* hooks_ = nullptr;
};
TORCH_MODULE(DFlashDraft);

}  // namespace fsdp::model
