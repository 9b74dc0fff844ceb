// The EAGLE3 draft modules: registration names match SpecForge's state dict exactly, numerics
// follow docs/reference.md §3 (fp32 RMSNorm, SwiGLU, rotate-half RoPE at position t + step, GQA).
// Never talks to other ranks: the sharding engine sees only the unit hooks.
#include "model/draft_model.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fsdp::model {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// What a checkpointed decoder-layer call needs besides its tensor inputs; held by the autograd
// node (as a capsule in its saved data) until backward has recomputed the layer.
struct LayerCall : torch::CustomClassHolder {
  std::shared_ptr<DraftLayer> layer;
  at::Tensor cos, sin;
  SeqLayout layout;
  AttentionImpl impl = AttentionImpl::kEfficient;
  int64_t past = 0;  // cached steps before this one
};

// Activation checkpointing of one decoder-layer use. Inputs (one flat list): e, h, the past
// keys [past], the past values [past], then the layer's trainable parameters. Outputs: out,
// and this step's keys and values. Forward runs without a graph and keeps only the inputs;
// backward reruns the layer with a graph and takes its gradients with autograd::grad. The
// parameter gradients are returned to the outer graph rather than accumulated here, so each
// parameter's AccumulateGrad still runs once per backward, after all TTT steps' contributions
// are summed (the sharding engine's gradient-ready hooks rely on that).
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                const c10::intrusive_ptr<LayerCall>& call) {
    const int64_t past = call->past;
    KVCache cache;
    cache.keys.assign(inputs.begin() + 2, inputs.begin() + 2 + past);
    cache.values.assign(inputs.begin() + 2 + past, inputs.begin() + 2 + 2 * past);
    at::Tensor out = call->layer->forward(inputs[0], inputs[1], call->cos, call->sin, cache,
                                          call->layout, call->impl);
    ctx->save_for_backward(std::vector<at::Tensor>(inputs.begin(), inputs.begin() + 2 + 2 * past));
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return {out, cache.keys.back(), cache.values.back()};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call = c10::static_intrusive_pointer_cast<LayerCall>(ctx->saved_data["call"].toCapsule());
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const int64_t past = call->past;
    const std::vector<at::Tensor> params = call->layer->parameters(/*recurse=*/true);
    const size_t n_in = saved.size() + params.size();

    // Fresh leaves for the saved inputs that need a gradient; the parameters are the live
    // (re-gathered) ones, used as grad() inputs so nothing accumulates into their .grad here.
    std::vector<at::Tensor> leaves(saved.size());
    std::vector<at::Tensor> wrt;
    std::vector<size_t> wrt_index;
    for (size_t i = 0; i < saved.size(); ++i) {
      leaves[i] = saved[i].detach();
      if (ctx->needs_input_grad(i)) {
        leaves[i].requires_grad_(true);
        wrt.push_back(leaves[i]);
        wrt_index.push_back(i);
      }
    }
    for (size_t j = 0; j < params.size(); ++j) {
      if (ctx->needs_input_grad(saved.size() + j)) {
        wrt.push_back(params[j]);
        wrt_index.push_back(saved.size() + j);
      }
    }
    torch::autograd::variable_list result(n_in + 1);  // + the LayerCall argument (no gradient)
    if (wrt.empty()) return result;

    at::Tensor out, k, v;
    {
      at::AutoGradMode enable(true);
      KVCache cache;
      cache.keys.assign(leaves.begin() + 2, leaves.begin() + 2 + past);
      cache.values.assign(leaves.begin() + 2 + past, leaves.begin() + 2 + 2 * past);
      out = call->layer->forward(leaves[0], leaves[1], call->cos, call->sin, cache, call->layout,
                                 call->impl);
      k = cache.keys.back();
      v = cache.values.back();
    }
    const torch::autograd::variable_list g = torch::autograd::grad(
        {out, k, v}, wrt, {grads[0], grads[1], grads[2]}, /*retain_graph=*/false,
        /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < wrt_index.size(); ++i) result[wrt_index[i]] = g[i];
    return result;
  }
};

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor xf = x.to(wide);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rms_norm_fused(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Without a weight the kernel's output is exactly the normalised x rounded once to x's dtype
  // (its statistics and products in fp32); its autograd formula runs the fused backward kernel.
  // 8 forward and about 14 backward kernels of the composite become 2 and 4.
  at::Tensor normed = std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, std::nullopt, eps));
  return weight * normed;
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  if (x.is_cuda() && x.scalar_type() != at::kDouble) return rms_norm_fused(x, weight, eps);
  return rms_norm_composite(x, weight, eps);
}

DraftLinearImpl::DraftLinearImpl(int64_t in, int64_t out) {
  // torch::nn::Linear's own initialisation (Kaiming uniform, a = sqrt(5)), so a draft draws the
  // same initial weights as before LoRA existed.
  weight = register_parameter("weight", linear(in, out)->weight.detach().clone());
}

at::Tensor DraftLinearImpl::forward(const at::Tensor& x) {
  if (grad_in_place && uses_ && !has_lora() && at::GradMode::is_enabled() && weight.requires_grad())
    return linear_grad_in_place(x, uses_);
  at::Tensor y = at::linear(x, weight);
  if (!has_lora()) return y;
  return y + lora_B(lora_A(x)) * lora_scale;
}

void DraftLinearImpl::begin_unroll() {
  uses_ = grad_in_place ? c10::make_intrusive<LinearUses>(weight) : nullptr;
}

void Eagle3DraftImpl::set_weight_grad_in_place(bool on) {
  weight_grad_in_place_ = on;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* lin = dynamic_cast<DraftLinearImpl*>(m.get())) lin->grad_in_place = on;
  }
  begin_unroll();
}

void Eagle3DraftImpl::begin_unroll() {
  if (!weight_grad_in_place_) return;  // nothing counts uses (a projection's flag is off too)
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* lin = dynamic_cast<DraftLinearImpl*>(m.get())) lin->begin_unroll();
  }
}

void DraftLinearImpl::add_lora(int64_t rank, double scale) {
  FSDP_CHECK(!has_lora(), "a LoRA adapter was added twice", "call enable_lora once");
  lora_A = register_module("lora_A", linear(weight.size(1), rank));
  lora_B = register_module("lora_B", linear(rank, weight.size(0)));
  {
    at::NoGradGuard guard;
    lora_B->weight.zero_();
  }
  lora_A->to(weight.scalar_type());
  lora_B->to(weight.scalar_type());
  lora_scale = scale;
}

Eagle3MLPImpl::Eagle3MLPImpl(int64_t hidden, int64_t intermediate) {
  gate_proj = register_module("gate_proj", DraftLinear(hidden, intermediate));
  up_proj = register_module("up_proj", DraftLinear(hidden, intermediate));
  down_proj = register_module("down_proj", DraftLinear(intermediate, hidden));
}

at::Tensor Eagle3MLPImpl::forward(const at::Tensor& x) {
  return down_proj(at::silu(gate_proj(x)) * up_proj(x));
}

Eagle3AttentionImpl::Eagle3AttentionImpl(const DraftConfig& cfg, int64_t in)
    : num_heads(cfg.num_attention_heads),
      num_kv_heads(cfg.num_key_value_heads),
      head_dim(cfg.head_dim_value()) {
  q_proj = register_module("q_proj", DraftLinear(in, cfg.q_out_features()));
  k_proj = register_module("k_proj", DraftLinear(in, cfg.kv_out_features()));
  v_proj = register_module("v_proj", DraftLinear(in, cfg.kv_out_features()));
  o_proj = register_module("o_proj", DraftLinear(cfg.q_out_features(), cfg.hidden_size));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, cfg.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim, cfg.rms_norm_eps));
  }
}

at::Tensor Eagle3AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                        const at::Tensor& sin, KVCache& cache,
                                        const SeqLayout& layout, AttentionImpl impl) {
  const int64_t B = x.size(0), S = x.size(1);
  at::Tensor q = q_proj(x).view({B, S, num_heads, head_dim}).transpose(1, 2);
  at::Tensor k = k_proj(x).view({B, S, num_kv_heads, head_dim}).transpose(1, 2);
  at::Tensor v = v_proj(x).view({B, S, num_kv_heads, head_dim}).transpose(1, 2);
  if (q_norm) {  // vLLM's Qwen3Attention: per-head norms, then RoPE
    q = q_norm(q);
    k = k_norm(k);
  }
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor attn;
  if (layout.shard) {
    // Ulysses (seq_parallel.h): my heads over the whole sequence; the cache holds that layout.
    const SeqShard& shard = *layout.shard;
    cache.keys.push_back(seq_to_head(k, shard));
    cache.values.push_back(seq_to_head(v, shard).contiguous());
    attn = head_to_seq(ttt_attention(seq_to_head(q, shard), cache.keys, cache.values,
                                     SeqLayout(shard.full_mask), scale, impl),
                       shard);
  } else {
    cache.keys.push_back(k);
    cache.values.push_back(v.contiguous());
    attn = ttt_attention(q, cache.keys, cache.values, layout, scale, impl);
  }
  return o_proj(attn.transpose(1, 2).reshape({B, S, num_heads * head_dim}));
}

Eagle3DecoderLayerImpl::Eagle3DecoderLayerImpl(const DraftConfig& cfg)
    : norm_before_residual(cfg.norm_before_residual) {
  const int64_t H = cfg.hidden_size;
  hidden_norm = register_module("hidden_norm", RMSNorm(H, cfg.rms_norm_eps));
  input_layernorm = register_module("input_layernorm", RMSNorm(H, cfg.rms_norm_eps));
  self_attn = register_module("self_attn", Eagle3Attention(cfg, 2 * H));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(H, cfg.rms_norm_eps));
  mlp = register_module("mlp", Eagle3MLP(H, cfg.intermediate_size));
}

at::Tensor Eagle3DecoderLayerImpl::forward(const at::Tensor& e, const at::Tensor& h,
                                           const at::Tensor& cos, const at::Tensor& sin,
                                           KVCache& cache, const SeqLayout& layout,
                                           AttentionImpl impl) {
  at::Tensor hn = hidden_norm(h);
  at::Tensor x = at::cat({input_layernorm(e), hn}, -1);  // embedding first
  at::Tensor h1 = (norm_before_residual ? hn : h) + self_attn(x, cos, sin, cache, layout, impl);
  return h1 + mlp(post_attention_layernorm(h1));
}

Eagle3LaterLayerImpl::Eagle3LaterLayerImpl(const DraftConfig& cfg) {
  const int64_t H = cfg.hidden_size;
  input_layernorm = register_module("input_layernorm", RMSNorm(H, cfg.rms_norm_eps));
  self_attn = register_module("self_attn", Eagle3Attention(cfg, H));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(H, cfg.rms_norm_eps));
  mlp = register_module("mlp", Eagle3MLP(H, cfg.intermediate_size));
}

at::Tensor Eagle3LaterLayerImpl::forward(const at::Tensor& /*e*/, const at::Tensor& h,
                                         const at::Tensor& cos, const at::Tensor& sin,
                                         KVCache& cache, const SeqLayout& layout,
                                         AttentionImpl impl) {
  at::Tensor h1 = h + self_attn(input_layernorm(h), cos, sin, cache, layout, impl);
  return h1 + mlp(post_attention_layernorm(h1));
}

Eagle3DraftImpl::Eagle3DraftImpl(const DraftConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, Vd = cfg.draft_vocab();
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(V, H));
  embed_tokens->weight.set_requires_grad(false);
  if (cfg.norm_before_fc) {
    input_norm = register_module("input_norm", RMSNorm(cfg.fc_in_features(), cfg.rms_norm_eps));
  }
  if (cfg.fc_norm) {
    fc_norm = register_module("fc_norm", torch::nn::ModuleList());
    for (int64_t j = 0; j < cfg.num_aux_hidden_states; ++j) {
      fc_norm->push_back(RMSNorm(cfg.target_hidden(), cfg.rms_norm_eps));
    }
  }
  fc = register_module("fc", linear(cfg.fc_in_features(), H));
  midlayer = Eagle3DecoderLayer(cfg);
  layers_.push_back(midlayer.ptr());
  if (cfg.num_hidden_layers == 1) {
    register_module("midlayer", midlayer);  // SpecForge's name
  } else {
    layers = register_module("layers", torch::nn::ModuleList());
    layers->push_back(midlayer);
    for (int64_t k = 1; k < cfg.num_hidden_layers; ++k) {
      Eagle3LaterLayer later(cfg);
      layers->push_back(later);
      layers_.push_back(later.ptr());
    }
  }
  norm = register_module("norm", RMSNorm(H, cfg.rms_norm_eps));
  lm_head = register_module("lm_head", linear(H, Vd));
  // Identity mapping of the first Vd ids until the real mapping is set.
  d2t = register_buffer("d2t", torch::zeros({Vd}, torch::kLong));
  t2d = register_buffer("t2d", torch::arange(V, torch::kLong).lt(Vd));
  // Positions t + i reach max_position_embeddings + T - 1 for the longest sequences.
  rope_ = RotaryEmbedding(cfg_, cfg.max_position_embeddings + 8);
}

void Eagle3DraftImpl::normal_init(double std) {
  FSDP_CHECK(std > 0 && std::isfinite(std), fsdp::str("initialisation std ", std, " is invalid"),
             "set initializer_range in the draft config to a positive number (0.02)");
  at::NoGradGuard guard;
  for (auto& p : named_parameters()) {
    if (p.value().dim() != 2 || p.key() == "embed_tokens.weight") continue;
    p.value().normal_(0.0, std);
  }
}

void Eagle3DraftImpl::load_embedding(const at::Tensor& weight) {
  FSDP_CHECK(
      weight.dim() == 2 && weight.size(0) == cfg_.vocab_size && weight.size(1) == cfg_.hidden_size,
      fsdp::str("target embedding has shape ", weight.sizes(), ", draft config ", cfg_.source,
                " expects [", cfg_.vocab_size, ", ", cfg_.hidden_size, "]"),
      "check --embedding-key and that the draft config matches the target model");
  at::NoGradGuard guard;
  embed_tokens->weight.copy_(weight);
}

void Eagle3DraftImpl::set_vocab_mapping(const at::Tensor& new_d2t, const at::Tensor& new_t2d) {
  FSDP_CHECK(new_d2t.dim() == 1 && new_d2t.size(0) == cfg_.draft_vocab() && new_t2d.dim() == 1 &&
                 new_t2d.size(0) == cfg_.vocab_size,
             fsdp::str("vocab mapping shapes d2t ", new_d2t.sizes(), ", t2d ", new_t2d.sizes(),
                       " do not match draft_vocab_size ", cfg_.draft_vocab(), " / vocab_size ",
                       cfg_.vocab_size, " of ", cfg_.source),
             "rebuild the vocab mapping for this config (delete the cached mapping)");
  const int64_t kept = new_t2d.to(at::kLong).sum().item<int64_t>();
  FSDP_CHECK(kept == cfg_.draft_vocab(),
             fsdp::str("t2d marks ", kept, " tokens, draft_vocab_size is ", cfg_.draft_vocab()),
             "rebuild the vocab mapping for this config");
  at::NoGradGuard guard;
  d2t.copy_(new_d2t.to(at::kLong));
  t2d.copy_(new_t2d.to(at::kBool));
}

void Eagle3DraftImpl::set_embedding_trainable(int64_t padding_idx) {
  FSDP_CHECK(padding_idx >= -1 && padding_idx < cfg_.vocab_size,
             fsdp::str("padding_idx ", padding_idx, " outside the vocabulary of ", cfg_.source),
             "give pad_token_id within vocab_size, or none");
  embedding_trainable_ = true;
  padding_idx_ = padding_idx;
  embed_tokens->weight.set_requires_grad(true);
}

at::Tensor Eagle3DraftImpl::embed(const at::Tensor& input_ids) {
  if (embedding_trainable_)
    return run_unit(hooks_, "embed_tokens",
                    [&] { return at::embedding(embed_tokens->weight, input_ids, padding_idx_); });
  return run_unit(hooks_, "embed_tokens", [&] {
    at::NoGradGuard guard;  // frozen: no graph through the [V, H] table
    return embed_tokens(input_ids);
  });
}

std::string Eagle3DraftImpl::layer_unit(int64_t k) const {
  return cfg_.num_hidden_layers == 1 ? std::string("midlayer") : fsdp::str("layers.", k);
}

std::vector<std::string> Eagle3DraftImpl::unit_names() const {
  std::vector<std::string> out{"embed_tokens"};
  if (cfg_.norm_before_fc) out.emplace_back("input_norm");
  if (cfg_.fc_norm) out.emplace_back("fc_norm");
  out.emplace_back("fc");
  for (int64_t k = 0; k < cfg_.num_hidden_layers; ++k) out.push_back(layer_unit(k));
  out.emplace_back("norm");
  out.emplace_back("lm_head");
  return out;
}

at::Tensor Eagle3DraftImpl::project_aux(const at::Tensor& aux_hidden) {
  FSDP_CHECK(aux_hidden.size(-1) == cfg_.fc_in_features(),
             fsdp::str("aux_hidden has last dim ", aux_hidden.size(-1), ", the fc layer of ",
                       cfg_.source, " expects ", cfg_.fc_in_features(), " (",
                       cfg_.num_aux_hidden_states, " x target hidden size)"),
             "the hidden states must come from the target this draft config describes");
  at::Tensor x = aux_hidden.to(fc->weight.scalar_type());
  if (cfg_.norm_before_fc) x = run_unit(hooks_, "input_norm", [&] { return input_norm(x); });
  if (cfg_.fc_norm) {
    // One norm per captured layer, over its Ht columns (vLLM's and speculators' chunking).
    x = run_unit(hooks_, "fc_norm", [&] {
      std::vector<at::Tensor> parts = x.chunk(cfg_.num_aux_hidden_states, -1);
      for (size_t j = 0; j < parts.size(); ++j)
        parts[j] = fc_norm[j]->as<RMSNormImpl>()->forward(parts[j]);
      return at::cat(parts, -1);
    });
  }
  return run_unit(hooks_, "fc", [&] { return fc(x); });
}

at::Tensor Eagle3DraftImpl::decode(const at::Tensor& e, const at::Tensor& h, int64_t step,
                                   DraftCache& cache, const SeqLayout& layout, AttentionImpl impl) {
  if (cache.layers.empty()) cache.layers.resize(layers_.size());
  FSDP_CHECK(cache.layers.size() == layers_.size() && cache.steps() == step,
             fsdp::str("decode step ", step, " with ", cache.steps(), " cached steps of ",
                       cache.layers.size(), " layers (the draft has ", layers_.size(), ")"),
             "run steps 0, 1, ... in order with one DraftCache per micro-batch");
  // Positions t + step; packed, t counts from each document's start (docs/model.md "Packing").
  // Sequence-parallel, this rank's positions start at the shard's offset.
  const int64_t first = layout.shard ? layout.shard->offset : 0;
  auto [cos, sin] = rope_.slice(step + first, e.size(1), e.scalar_type(), e.device());
  if (layout.packed() && layout.documents.size() > 1) {
    std::vector<at::Tensor> cs, ss;
    for (const int64_t L : layout.documents) {
      auto [c, s] = rope_.slice(step, L, e.scalar_type(), e.device());
      cs.push_back(c);
      ss.push_back(s);
    }
    cos = at::cat(cs, 0);
    sin = at::cat(ss, 0);
  }
  at::Tensor x = h;
  for (size_t k = 0; k < layers_.size(); ++k) {
    DraftLayer& layer = *layers_[k];
    KVCache& kv = cache.layers[k];
    if (!checkpoint_layer_ || !at::GradMode::is_enabled()) {
      x = run_unit(hooks_, layer_unit(static_cast<int64_t>(k)),
                   [&] { return layer.forward(e, x, cos, sin, kv, layout, impl); });
      continue;
    }
    x = run_unit(hooks_, layer_unit(static_cast<int64_t>(k)), [&] {
      auto call = c10::make_intrusive<LayerCall>();
      call->layer = layers_[k];
      call->cos = cos;
      call->sin = sin;
      call->layout = layout;
      call->impl = impl;
      call->past = step;
      std::vector<at::Tensor> inputs{e, x};
      inputs.insert(inputs.end(), kv.keys.begin(), kv.keys.end());
      inputs.insert(inputs.end(), kv.values.begin(), kv.values.end());
      for (const at::Tensor& p : layer.parameters(/*recurse=*/true)) inputs.push_back(p);
      torch::autograd::variable_list r = CheckpointedLayer::apply(at::TensorList(inputs), call);
      kv.keys.push_back(r[1]);
      kv.values.push_back(r[2]);
      return r[0];
    });
  }
  return x;
}

at::Tensor Eagle3DraftImpl::step_output(const at::Tensor& out) {
  if (!cfg_.norm_output) return out;
  return run_unit(hooks_, "norm", [&] { return norm(out); });
}

at::Tensor Eagle3DraftImpl::logits(const at::Tensor& x) {
  at::Tensor n = cfg_.norm_output ? x : run_unit(hooks_, "norm", [&] { return norm(x); });
  return run_unit(hooks_, "lm_head", [&] { return lm_head(n); });
}

void Eagle3DraftImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  Module::to(device, dtype, non_blocking);
  restore_mapping_dtypes();
}

void Eagle3DraftImpl::to(torch::Dtype dtype, bool non_blocking) {
  Module::to(dtype, non_blocking);
  restore_mapping_dtypes();
}

void Eagle3DraftImpl::to(torch::Device device, bool non_blocking) {
  Module::to(device, non_blocking);
}

void Eagle3DraftImpl::restore_mapping_dtypes() {
  // set_data keeps the registered buffer and this member pointing at the same tensor.
  if (d2t.scalar_type() != at::kLong) d2t.set_data(d2t.to(at::kLong));
  if (t2d.scalar_type() != at::kBool) t2d.set_data(t2d.to(at::kBool));
}

bool is_lora_tensor(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

ProjectionShape projection_shape(const DraftConfig& cfg, LoraTarget target, int64_t layer) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t attn_in = layer == 0 ? 2 * H : H;  // the first layer's attention reads [e; h]
  switch (target) {
    case LoraTarget::kQProj:
      return {attn_in, cfg.q_out_features()};
    case LoraTarget::kKProj:
    case LoraTarget::kVProj:
      return {attn_in, cfg.kv_out_features()};
    case LoraTarget::kOProj:
      return {cfg.q_out_features(), H};
    case LoraTarget::kGateProj:
    case LoraTarget::kUpProj:
      return {H, I};
    case LoraTarget::kDownProj:
      return {I, H};
  }
  FSDP_FAIL(fsdp::str("unknown LoRA target ", static_cast<int>(target)),
            "this is a bug in fsdp-train: please report it");
  return {};
}

void check_lora_rank(const DraftConfig& cfg, int64_t rank, const std::vector<LoraTarget>& targets) {
  // Every later layer has the same shapes, so layers 0 and 1 cover the draft.
  for (int64_t layer = 0; layer < std::min<int64_t>(cfg.num_hidden_layers, 2); ++layer) {
    for (const LoraTarget t : targets) {
      const ProjectionShape p = projection_shape(cfg, t, layer);
      const int64_t limit = std::min(p.in, p.out);
      const char* name = lora_target_name(t);
      FSDP_USAGE_CHECK(
          rank <= limit,
          fsdp::str("--lora-rank ", rank, " is above min(in, out) = ", limit, " of ", name, " (",
                    p.in, " -> ", p.out, " features in decoder layer ", layer, " of this draft)"),
          fsdp::str("give --lora-rank at most ", limit, ", or drop ", name,
                    " from --lora-targets"));
    }
  }
}

void Eagle3DraftImpl::enable_lora(int64_t rank, double alpha,
                                  const std::vector<LoraTarget>& targets) {
  FSDP_USAGE_CHECK(rank >= 1, fsdp::str("LoRA rank must be >= 1, got ", rank),
                   "use --lora-rank 8, 16 or 32");
  FSDP_USAGE_CHECK(std::isfinite(alpha) && alpha > 0,
                   fsdp::str("LoRA alpha must be positive, got ", alpha),
                   "use e.g. --lora-alpha 16");
  FSDP_CHECK(lora_rank_ == 0, "LoRA enabled twice", "call enable_lora once");
  FSDP_USAGE_CHECK(!targets.empty(), "no LoRA targets given",
                   "list them with --lora-targets, e.g. q_proj,k_proj,v_proj,o_proj");
  const double scale = alpha / static_cast<double>(rank);
  auto want = [&](const std::string& leaf) {
    const std::optional<LoraTarget> t = parse_lora_target(leaf);
    return t && std::find(targets.begin(), targets.end(), *t) != targets.end();
  };
  for (const auto& layer : layers_) {
    for (const auto& child : layer->named_modules("", /*include_self=*/false)) {
      auto* lin = child.value()->as<DraftLinearImpl>();
      if (!lin) continue;
      const std::string& path = child.key();  // self_attn.q_proj, mlp.down_proj, ...
      const std::string leaf = path.substr(path.rfind('.') + 1);
      if (want(leaf)) lin->add_lora(rank, scale);
    }
  }
  for (auto& p : named_parameters(true)) p.value().set_requires_grad(is_lora_tensor(p.key()));
  lora_rank_ = rank;
}

int64_t merge_lora(std::map<std::string, at::Tensor>& state, double scale) {
  const std::string a_suffix = ".lora_A.weight", b_suffix = ".lora_B.weight";
  std::vector<std::string> prefixes;
  for (const auto& [name, t] : state) {
    if (name.size() > a_suffix.size() &&
        name.compare(name.size() - a_suffix.size(), a_suffix.size(), a_suffix) == 0)
      prefixes.push_back(name.substr(0, name.size() - a_suffix.size()));
  }
  for (const auto& p : prefixes) {
    FSDP_CHECK(
        state.count(p + b_suffix) && state.count(p + ".weight"),
        fsdp::str("LoRA adapter ", p, a_suffix, " without ", p, b_suffix, " or ", p, ".weight"),
        "merge a complete state (base weights and both adapter matrices)");
    at::Tensor& w = state.at(p + ".weight");
    const at::Tensor a = state.at(p + a_suffix).to(at::kDouble);
    const at::Tensor b = state.at(p + b_suffix).to(at::kDouble);
    FSDP_CHECK(
        a.dim() == 2 && b.dim() == 2 && b.size(1) == a.size(0) && w.size(0) == b.size(0) &&
            w.size(1) == a.size(1),
        fsdp::str("LoRA shapes of ", p, ": A ", a.sizes(), ", B ", b.sizes(), ", W ", w.sizes()),
        "merge adapters trained for this draft");
    w = (w.to(at::kDouble) + scale * at::matmul(b, a)).to(w.scalar_type());
    state.erase(p + a_suffix);
    state.erase(p + b_suffix);
  }
  return static_cast<int64_t>(prefixes.size());
}

std::vector<at::Tensor> Eagle3DraftImpl::trainable_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : named_parameters(true)) {
    if ((embedding_trainable_ || p.key().rfind("embed_tokens.", 0) != 0) &&
        p.value().requires_grad())
      out.push_back(p.value());
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Eagle3DraftImpl::export_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : named_parameters(true)) {
    if (p.key().rfind("embed_tokens.", 0) != 0) out.emplace_back(p.key(), p.value());
  }
  out.emplace_back("d2t", d2t);
  out.emplace_back("t2d", t2d);
  return out;
}

}  // namespace fsdp::model
