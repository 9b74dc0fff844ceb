// The EAGLE3 draft model (docs/reference.md §3): LlamaForCausalLMEagle3 with one decoder layer, as
// a LibTorch module tree whose state-dict names match SpecForge exactly, and its variants
// (docs/model.md "Draft variants"): EAGLE3.1's fc_norm and norm_output, norm_before_fc,
// norm_before_residual and drafts of several decoder layers. Knows nothing about distribution:
// it only announces its units through fsdp::UnitHooks.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/unit_hooks.h"
#include "model/draft_config.h"
#include "model/linear_grad.h"
#include "model/lora_target.h"
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

// A bias-free linear layer y = x W^T with `weight` [out, in] (initialised as torch::nn::Linear,
// drawing the same random numbers), and an optional LoRA adapter (docs/model.md "LoRA"):
// y = x W^T + scale * (x A^T) B^T with A = lora_A.weight [r, in], B = lora_B.weight [out, r]
// (PEFT's names and order of operations).
class DraftLinearImpl : public torch::nn::Module {
 public:
  DraftLinearImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x);
  // Adds the adapter: A Kaiming-uniform (a = sqrt(5), PEFT's default), B zeros, so the adapted
  // layer starts equal to the base. The base weight is not frozen here (Eagle3DraftImpl::
  // enable_lora freezes everything but the adapters).
  void add_lora(int64_t rank, double scale);
  bool has_lora() const { return !lora_A.is_empty(); }
  // The weight gradient summed inside its GEMM over the unroll's uses (model/linear_grad.h):
  // when set (and grad mode on, the weight trainable, no adapter), forward goes through
  // linear_grad_in_place with the uses of the current unroll (begin_unroll()).
  bool grad_in_place = false;
  void begin_unroll();
  at::Tensor weight;
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  double lora_scale = 0.0;

 private:
  c10::intrusive_ptr<LinearUses> uses_;
};
TORCH_MODULE(DraftLinear);

// down(silu(gate(x)) * up(x)), no biases.
class Eagle3MLPImpl : public torch::nn::Module {
 public:
  Eagle3MLPImpl(int64_t hidden, int64_t intermediate);
  at::Tensor forward(const at::Tensor& x);
  DraftLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Eagle3MLP);

// One decoder layer's keys and values of every TTT step so far (index = step), each
// [B, nkv, S, d], rotated.
struct KVCache {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  int64_t steps() const { return static_cast<int64_t>(keys.size()); }
};

// The caches of all decoder layers of one unroll (index = layer); created empty, sized by the
// first decode().
struct DraftCache {
  std::vector<KVCache> layers;
  int64_t steps() const { return layers.empty() ? 0 : layers[0].steps(); }
};

// q/k/v/o projections over an `in`-wide input (2H for the first layer, H for later ones), with
// q_norm/k_norm in Qwen3 layers; the step's keys/values are appended to the cache.
class Eagle3AttentionImpl : public torch::nn::Module {
 public:
  Eagle3AttentionImpl(const DraftConfig& cfg, int64_t in);
  // x [B, S, in]; cos/sin [S, d] for positions t + step; returns [B, S, H].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     KVCache& cache, const SeqLayout& layout, AttentionImpl impl);
  DraftLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Qwen3 layers only (DraftConfig::qk_norm): RMSNorm over each head of q and k, before RoPE.
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  int64_t num_heads, num_kv_heads, head_dim;
};
TORCH_MODULE(Eagle3Attention);

// A decoder layer of the draft, as the unroll and activation checkpointing call it: e token
// embeddings [B, S, H] (read by the first layer only), h the layer input [B, S, H]; returns the
// layer output [B, S, H] and appends this step's keys/values to `cache`.
class DraftLayer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& e, const at::Tensor& h, const at::Tensor& cos,
                             const at::Tensor& sin, KVCache& cache, const SeqLayout& layout,
                             AttentionImpl impl) = 0;
};

// The first (for SpecForge's one-layer draft, the only) decoder layer (docs/reference.md §3.1
// steps 1-4): attention over [input_layernorm(e), hidden_norm(h)]. With norm_before_residual the
// residual is hidden_norm(h) instead of h (vLLM's and speculators' variant).
class Eagle3DecoderLayerImpl : public DraftLayer {
 public:
  explicit Eagle3DecoderLayerImpl(const DraftConfig& cfg);
  at::Tensor forward(const at::Tensor& e, const at::Tensor& h, const at::Tensor& cos,
                     const at::Tensor& sin, KVCache& cache, const SeqLayout& layout,
                     AttentionImpl impl) override;
  RMSNorm hidden_norm{nullptr}, input_layernorm{nullptr};
  Eagle3Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Eagle3MLP mlp{nullptr};
  bool norm_before_residual = false;
};
TORCH_MODULE(Eagle3DecoderLayer);

// A later layer of a multi-layer draft: a plain pre-norm Llama layer, as vLLM's and speculators'
// EAGLE3 drafts build layers 1..L-1: x = h + attn(input_layernorm(h)) over an H-wide input,
// out = x + mlp(post_attention_layernorm(x)). `e` is not read.
class Eagle3LaterLayerImpl : public DraftLayer {
 public:
  explicit Eagle3LaterLayerImpl(const DraftConfig& cfg);
  at::Tensor forward(const at::Tensor& e, const at::Tensor& h, const at::Tensor& cos,
                     const at::Tensor& sin, KVCache& cache, const SeqLayout& layout,
                     AttentionImpl impl) override;
  RMSNorm input_layernorm{nullptr};
  Eagle3Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Eagle3MLP mlp{nullptr};
};
TORCH_MODULE(Eagle3LaterLayer);

// State dict: embed_tokens.weight (frozen), fc.weight, midlayer.* (one layer) or layers.<k>.*
// (L > 1 layers: vLLM's and speculators' names), norm.weight, lm_head.weight, buffers d2t (int64
// [Vd]) and t2d (bool [V]); with fc_norm fc_norm.<j>.weight, with norm_before_fc
// input_norm.weight (vLLM's names). Parameters are created in fp32 with PyTorch's default Linear
// init; call ->to(dtype) for the compute dtype.
//
// Units announced through the hooks (unit_names()): embed_tokens, [input_norm | fc_norm], fc,
// each decoder layer (midlayer, or layers.0 .. layers.L-1), norm, lm_head. The fc norms and fc
// run once per micro-batch; embed_tokens, the layers, norm and lm_head once per TTT step. A
// layer's unit output is its `out`; the step's keys/values go to the layer's KVCache as side
// outputs whose backward always runs after out's gradient has arrived (step i's attention
// consumes them after out_i is produced), so a pre-backward hook on `out` precedes every use of
// the layer's parameters in backward.
class Eagle3DraftImpl : public torch::nn::Module {
 public:
  explicit Eagle3DraftImpl(const DraftConfig& cfg);

  const DraftConfig& config() const { return cfg_; }
  void set_unit_hooks(fsdp::UnitHooks* hooks) { hooks_ = hooks; }
  fsdp::UnitHooks* unit_hooks() const { return hooks_; }

  // Hugging Face's post_init for this draft (what SpecForge's drafts start from): every matrix
  // but the (frozen) embedding drawn from N(0, std), in named_parameters() order; norms stay 1.
  // The constructor's initialisation is torch.nn.Linear's default (Kaiming uniform).
  void normal_init(double std);
  // Copies the target embedding [V, H] into embed_tokens (dtype converted); stays frozen.
  void load_embedding(const at::Tensor& weight);
  // P-EAGLE (model/peagle_model.h) trains the embedding: embed() then builds its graph through
  // the table and trainable_parameters() includes it; the row `padding_idx` (-1: none) gets no
  // gradient, as torch.nn.Embedding's padding_idx. Call before the sharding engine is built.
  void set_embedding_trainable(int64_t padding_idx);
  bool embedding_trainable() const { return embedding_trainable_; }
  // Sets d2t [Vd] int64 and t2d [V] bool (docs/reference.md §2); shapes checked.
  void set_vocab_mapping(const at::Tensor& d2t, const at::Tensor& t2d);

  // The units the sharding engine should make, in forward order (EngineOptions::units).
  std::vector<std::string> unit_names() const;
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // The module of decoder layer k (0 = midlayer).
  DraftLayer& layer(int64_t k) { return *layers_.at(static_cast<size_t>(k)); }

  // The pieces of one TTT unroll, each wrapped in its unit (see ttt_loss.h for the unroll).
  at::Tensor embed(const at::Tensor& input_ids);         // [B,S] -> [B,S,H]
  at::Tensor project_aux(const at::Tensor& aux_hidden);  // [B,S,n*Ht] -> [B,S,H] (fc norms, fc)
  // All decoder layers, each with its cache in `cache`: -> the last layer's out [B,S,H].
  at::Tensor decode(const at::Tensor& e, const at::Tensor& h, int64_t step, DraftCache& cache,
                    const SeqLayout& layout, AttentionImpl impl);
  // What a step hands on, from the last layer's out: norm(out) with norm_output (the normed
  // state feeds both the LM head and the next step), else out itself.
  at::Tensor step_output(const at::Tensor& out);
  // Logits [.., Vd] from step_output rows: lm_head(norm(x)), or lm_head(x) with norm_output
  // (x is normed already).
  at::Tensor logits(const at::Tensor& x);

  // The chunked head (docs/model.md "Chunked head and loss"): logits(x) over chunks of
  // `chunk_rows` rows of x [N, H] (step_output rows), inside one use of the norm and lm_head
  // units (norm's enclosing lm_head's). Returns fns.values of every chunk joined along dim 1
  // ([k, N]; undefined without values). With a graph to build, backward recomputes each chunk's
  // logits from x and the live weights instead of keeping them: the memory held for the head
  // is x, not [N, Vd] logits; values, x's gradient rows and the norm's and lm_head's weight
  // gradients (summed over chunks in fp32) equal logits' within rounding.
  struct HeadFns {
    // The differentiable values of rows [from, from + n) from their logits z [n, Vd]: [k, n],
    // the same k for every chunk. Runs in forward and again in backward, so it must hold what
    // it reads by value.
    std::function<at::Tensor(const at::Tensor& z, int64_t from)> values;
    // Forward only, without a graph: anything else read from a chunk's logits (argmax, metrics).
    std::function<void(const at::Tensor& z, int64_t from)> inspect;
  };
  at::Tensor head_rows(const at::Tensor& x, int64_t chunk_rows, const HeadFns& fns);

  // Activation checkpointing of the decoder layer: when on (and grad mode is enabled), each
  // decode() keeps only its inputs (e, h, the cache) and its outputs; backward recomputes the
  // layer's activations before taking its gradients. Same values and gradients, less memory:
  // the attention, MLP and norm activations of all TTT steps are never held at once.
  void set_checkpoint_layer(bool on) { checkpoint_layer_ = on; }
  bool checkpoint_layer() const { return checkpoint_layer_; }

  // The decoder projections' weight gradients summed inside their GEMMs over the TTT steps
  // (model/linear_grad.h; --fused-cuda-kernels without activation checkpointing, whose
  // recomputation runs each step's graph on its own). begin_unroll() starts a new count of uses;
  // the TTT unroll calls it.
  void set_weight_grad_in_place(bool on);
  void begin_unroll();

  // Module::to converts every buffer, integer ones included; these keep d2t int64 and t2d bool
  // (as PyTorch's Python Module.to(dtype) does for non-float buffers).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // LoRA adaptation (docs/model.md "LoRA"): adds an adapter of `rank` with scale alpha / rank to
  // every projection of every decoder layer that `targets` names (model/lora_target.h) and
  // freezes every other parameter. Call before the sharding engine is built (it splits units by
  // requires_grad). Throws UsageError for a rank below 1, a non-positive alpha or no target.
  void enable_lora(int64_t rank, double alpha, const std::vector<LoraTarget>& targets);
  bool lora_enabled() const { return lora_rank_ > 0; }

  // Trainable parameters (those requiring a gradient: everything except embed_tokens, or the
  // LoRA adapters alone), in registration order.
  std::vector<at::Tensor> trainable_parameters() const;
  // Export tensors of docs/reference.md §7 (no embed_tokens): name -> tensor, in state-dict order.
  std::vector<std::pair<std::string, at::Tensor>> export_tensors() const;

  torch::nn::Embedding embed_tokens{nullptr};
  RMSNorm input_norm{nullptr};             // norm_before_fc only
  torch::nn::ModuleList fc_norm{nullptr};  // fc_norm only: n RMSNorms over Ht
  torch::nn::Linear fc{nullptr};
  Eagle3DecoderLayer midlayer{nullptr};   // the first layer, whatever its registered name
  torch::nn::ModuleList layers{nullptr};  // L > 1 only: midlayer, then the later layers
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
  at::Tensor d2t, t2d;

 private:
  void restore_mapping_dtypes();
  std::string layer_unit(int64_t k) const;
  std::vector<std::shared_ptr<DraftLayer>> layers_;
  int64_t lora_rank_ = 0;
  DraftConfig cfg_;
  RotaryEmbedding rope_;
  fsdp::UnitHooks* hooks_ = nullptr;
  bool checkpoint_layer_ = false;
  bool weight_grad_in_place_ = false;  // set_weight_grad_in_place
  bool embedding_trainable_ = false;   // set_embedding_trainable
  int64_t padding_idx_ = -1;
};
TORCH_MODULE(Eagle3Draft);

}  // namespace fsdp::model

namespace fsdp::model {

// Whether a parameter name is a LoRA adapter's ("<module>.lora_A.weight" / ".lora_B.weight").
bool is_lora_tensor(const std::string& name);

// In and out features of the projection `target` in decoder layer
// `layer` of a draft built from `cfg`: the first layer's q/k/v read the 2H concatenation of
// embedding and hidden state, every later layer's read H.
struct ProjectionShape {
  int64_t in = 0, out = 0;
};
ProjectionShape projection_shape(const DraftConfig& cfg, LoraTarget target, int64_t layer);
// A LoRA rank above min(in, out) of a targeted projection in any layer is no low-rank update
// (and PEFT refuses to load it): a UsageError naming --lora-rank, the projection and both
// numbers. Run at start-up, from the draft config alone, before anything is loaded.
void check_lora_rank(const DraftConfig& cfg, int64_t rank, const std::vector<LoraTarget>& targets);

// Folds LoRA adapters into their base weights in `state` (a full state dict by parameter name):
// for every "<p>.lora_A.weight" with "<p>.lora_B.weight", "<p>.weight" becomes
// W + scale * B A (computed in float64, stored in W's dtype) and the adapter tensors are removed.
// Returns the number of weights merged. Throws when an adapter lacks its pair or base.
int64_t merge_lora(std::map<std::string, at::Tensor>& state, double scale);

}  // namespace fsdp::model
