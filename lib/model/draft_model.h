// The EAGLE3 draft model (docs/reference.md §3): LlamaForCausalLMEagle3 with one decoder layer, as
// a LibTorch module tree whose state-dict names match SpecForge exactly. Knows nothing about
// distribution: it only announces its top-level units through fsdp::UnitHooks.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "core/unit_hooks.h"
#include "model/draft_config.h"
#include "model/rope.h"
#include "model/ttt_attention.h"

namespace fsdp::model {

// x * rsqrt(mean(x^2) + eps) in fp32, cast back to x's dtype, then times weight (docs/reference.md
// §3), as separate ATen operations: the definition, used on the CPU and for float64 everywhere.
at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps);

// The same on a GPU: the normalisation through LibTorch's fused RMSNorm kernel without a
// weight (fp32 statistics, one rounding to x's dtype, a fused backward), then the weight
// multiplied in x's dtype as docs/reference.md §3 orders it. Differs from the composite only in the
// fp32 summation order of mean(x^2).
at::Tensor rms_norm_fused(const at::Tensor& x, const at::Tensor& weight, double eps);

// x * rsqrt(mean(x^2) + eps) in fp32, cast back to x's dtype, then times weight (init ones):
// rms_norm_fused for CUDA (and ROCm) tensors other than float64, rms_norm_composite otherwise.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// down(silu(gate(x)) * up(x)), no biases.
class Eagle3MLPImpl : public torch::nn::Module {
 public:
  Eagle3MLPImpl(int64_t hidden, int64_t intermediate);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Eagle3MLP);

// Keys and values of every TTT step so far (index = step), each [B, nkv, S, d], rotated.
struct KVCache {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  int64_t steps() const { return static_cast<int64_t>(keys.size()); }
};

// q/k/v/o projections over the 2H input; the step's keys/values are appended to the cache.
class Eagle3AttentionImpl : public torch::nn::Module {
 public:
  explicit Eagle3AttentionImpl(const DraftConfig& cfg);
  // x [B, S, 2H]; cos/sin [S, d] for positions t + step; returns [B, S, H].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     KVCache& cache, const at::Tensor& attention_mask, AttentionImpl impl);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t num_heads, num_kv_heads, head_dim;
};
TORCH_MODULE(Eagle3Attention);

// The single decoder layer (docs/reference.md §3.1 steps 1-4).
class Eagle3DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit Eagle3DecoderLayerImpl(const DraftConfig& cfg);
  // e token embeddings [B, S, H], h running hidden [B, S, H]; returns out [B, S, H].
  at::Tensor forward(const at::Tensor& e, const at::Tensor& h, const at::Tensor& cos,
                     const at::Tensor& sin, KVCache& cache, const at::Tensor& attention_mask,
                     AttentionImpl impl);
  RMSNorm hidden_norm{nullptr}, input_layernorm{nullptr};
  Eagle3Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Eagle3MLP mlp{nullptr};
};
TORCH_MODULE(Eagle3DecoderLayer);

// State dict: embed_tokens.weight (frozen), fc.weight, midlayer.*, norm.weight, lm_head.weight,
// buffers d2t (int64 [Vd]) and t2d (bool [V]). Parameters are created in fp32 with PyTorch's
// default Linear init; call ->to(dtype) for the compute dtype.
//
// Top-level units announced through the hooks (child names): embed_tokens, fc, midlayer, norm,
// lm_head. fc runs once per micro-batch; embed_tokens, midlayer, norm and lm_head once per TTT
// step. The midlayer's unit output is `out`; the step's keys/values go to the KVCache as side
// outputs whose backward always runs after out's gradient has arrived (step i's attention
// consumes them after out_i is produced), so a pre-backward hook on `out` precedes every use of
// the midlayer parameters in backward.
class Eagle3DraftImpl : public torch::nn::Module {
 public:
  explicit Eagle3DraftImpl(const DraftConfig& cfg);

  const DraftConfig& config() const { return cfg_; }
  void set_unit_hooks(fsdp::UnitHooks* hooks) { hooks_ = hooks; }
  fsdp::UnitHooks* unit_hooks() const { return hooks_; }

  // Copies the target embedding [V, H] into embed_tokens (dtype converted); stays frozen.
  void load_embedding(const at::Tensor& weight);
  // Sets d2t [Vd] int64 and t2d [V] bool (docs/reference.md §2); shapes checked.
  void set_vocab_mapping(const at::Tensor& d2t, const at::Tensor& t2d);

  // The pieces of one TTT unroll, each wrapped in its unit (see ttt_loss.h for the unroll).
  at::Tensor embed(const at::Tensor& input_ids);         // [B,S] -> [B,S,H]
  at::Tensor project_aux(const at::Tensor& aux_hidden);  // [B,S,3Ht] -> [B,S,H]
  at::Tensor decode(const at::Tensor& e, const at::Tensor& h, int64_t step, KVCache& cache,
                    const at::Tensor& attention_mask, AttentionImpl impl);  // -> out [B,S,H]
  at::Tensor logits(const at::Tensor& out);  // norm + lm_head -> [B,S,Vd]

  // Activation checkpointing of the decoder layer: when on (and grad mode is enabled), each
  // decode() keeps only its inputs (e, h, the cache) and its outputs; backward recomputes the
  // layer's activations before taking its gradients. Same values and gradients, less memory:
  // the attention, MLP and norm activations of all TTT steps are never held at once.
  void set_checkpoint_layer(bool on) { checkpoint_layer_ = on; }
  bool checkpoint_layer() const { return checkpoint_layer_; }

  // Module::to converts every buffer, integer ones included; these keep d2t int64 and t2d bool
  // (as PyTorch's Python Module.to(dtype) does for non-float buffers).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // Trainable parameters (everything except embed_tokens), in registration order.
  std::vector<at::Tensor> trainable_parameters() const;
  // Export tensors of docs/reference.md §7 (no embed_tokens): name -> tensor, in state-dict order.
  std::vector<std::pair<std::string, at::Tensor>> export_tensors() const;

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::Linear fc{nullptr};
  Eagle3DecoderLayer midlayer{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
  at::Tensor d2t, t2d;

 private:
  void restore_mapping_dtypes();
  DraftConfig cfg_;
  RotaryEmbedding rope_;
  fsdp::UnitHooks* hooks_ = nullptr;
  bool checkpoint_layer_ = false;
};
TORCH_MODULE(Eagle3Draft);

}  // namespace fsdp::model
