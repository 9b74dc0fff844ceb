// The DFlash block draft (model/dflash_model.h).
#include "model/dflash_model.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <limits>

#include "core/error.h"

namespace fsdp::model {
namespace {

torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// [B, kv, T, d] -> [B, kv * groups, T, d], each key/value head repeated for its query heads.
at::Tensor repeat_kv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto B = x.size(0), kv = x.size(1), T = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({B, kv, groups, T, d}).reshape({B, kv * groups, T, d});
}

// Which context keys each block query may see: [B, 1, Q, S] bool.
at::Tensor context_mask(const BlockLayout& l, std::optional<int64_t> window) {
  const auto dev = l.anchors.device();
  const int64_t bs = l.block_size, S = l.context_len;
  const at::Tensor anchor = l.anchors.repeat_interleave(bs, 1).view({l.anchors.size(0), 1, -1, 1});
  const at::Tensor kv =
      at::arange(S, at::TensorOptions().dtype(at::kLong).device(dev)).view({1, 1, 1, S});
  at::Tensor allowed = kv < anchor;  // strictly before the anchor: its feature is not yet known
  if (window) {
    const at::Tensor offset =
        at::arange(l.num_blocks() * bs, at::TensorOptions().dtype(at::kLong).device(dev))
            .remainder(bs)
            .view({1, 1, -1, 1});
    // The query's own slot counts towards the window.
    allowed = allowed & (kv >= anchor + offset - (*window - 1));
  }
  const at::Tensor keep = l.keep.repeat_interleave(bs, 1).view({l.anchors.size(0), 1, -1, 1});
  return allowed & keep;
}

// Which keys of its own block each query may see: [B, 1, Q, bs] bool (all of them; a sliding
// layer: those up to its own offset).
at::Tensor block_mask(const BlockLayout& l, std::optional<int64_t> window) {
  const auto dev = l.anchors.device();
  const int64_t bs = l.block_size, N = l.num_blocks();
  at::Tensor keep = l.keep.repeat_interleave(bs, 1).view({l.anchors.size(0), 1, N * bs, 1});
  at::Tensor allowed = keep.expand({l.anchors.size(0), 1, N * bs, bs});
  if (window) {
    const auto opts = at::TensorOptions().dtype(at::kLong).device(dev);
    const at::Tensor q_off = at::arange(N * bs, opts).remainder(bs).view({1, 1, -1, 1});
    const at::Tensor kv_off = at::arange(bs, opts).view({1, 1, 1, bs});
    allowed = allowed & (kv_off <= q_off);
  }
  return allowed;
}

}  // namespace

DFlashAttentionImpl::DFlashAttentionImpl(const DFlashConfig& cfg, int64_t layer)
    : num_heads(cfg.core.num_attention_heads),
      num_kv_heads(cfg.core.num_key_value_heads),
      head_dim(cfg.head_dim()) {
  const int64_t H = cfg.hidden_size();
  const bool bias = cfg.attention_bias;
  q_proj = register_module("q_proj", make_linear(H, num_heads * head_dim, bias));
  k_proj = register_module("k_proj", make_linear(H, num_kv_heads * head_dim, bias));
  v_proj = register_module("v_proj", make_linear(H, num_kv_heads * head_dim, bias));
  o_proj = register_module("o_proj", make_linear(num_heads * head_dim, H, bias));
  q_norm = register_module("q_norm", RMSNorm(head_dim, cfg.core.rms_norm_eps));
  k_norm = register_module("k_norm", RMSNorm(head_dim, cfg.core.rms_norm_eps));
  if (cfg.layer_types.at(static_cast<size_t>(layer)) == BlockAttention::kSliding)
    sliding_window = cfg.sliding_window;
}

// Eager attention over [context | own block] keys: the scores against the context and against
// the query's own block are computed apart (the other blocks' keys are never visible, so they
// are never formed), softmax over both in fp32, masked keys at the dtype's lowest value as
// transformers' eager path adds them; a query that sees nothing (a dropped block) outputs 0.
at::Tensor DFlashAttentionImpl::forward(const at::Tensor& x, const at::Tensor& ctx,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        const BlockLayout& layout) {
  const int64_t B = x.size(0), Q = x.size(1), S = ctx.size(1), bs = layout.block_size;
  const int64_t N = Q / bs, d = head_dim, groups = num_heads / num_kv_heads;
  at::Tensor q = q_norm(q_proj(x).view({B, Q, num_heads, d})).transpose(1, 2);
  at::Tensor k = at::cat({k_proj(ctx), k_proj(x)}, 1).view({B, S + Q, num_kv_heads, d});
  at::Tensor v = at::cat({v_proj(ctx), v_proj(x)}, 1).view({B, S + Q, num_kv_heads, d});
  k = k_norm(k).transpose(1, 2);
  v = v.transpose(1, 2);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  q = apply_rotary(q, c.narrow(2, S, Q), s.narrow(2, S, Q));
  k = apply_rotary(k, c, s);
  k = repeat_kv(k, groups);
  v = repeat_kv(v, groups);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor k_ctx = k.narrow(2, 0, S), v_ctx = v.narrow(2, 0, S);
  const at::Tensor k_blk = k.narrow(2, S, Q).reshape({B, num_heads, N, bs, d});
  const at::Tensor v_blk = v.narrow(2, S, Q).reshape({B, num_heads, N, bs, d});
  at::Tensor s_ctx = at::matmul(q, k_ctx.transpose(2, 3)) * scale;  // [B, nh, Q, S]
  at::Tensor s_blk = at::matmul(q.reshape({B, num_heads, N, bs, d}), k_blk.transpose(3, 4)) * scale;
  s_blk = s_blk.reshape({B, num_heads, Q, bs});
  const double lowest = x.scalar_type() == at::kDouble  ? std::numeric_limits<double>::lowest()
                        : x.scalar_type() == at::kFloat ? std::numeric_limits<float>::lowest()
                                                        : -3.3895313892515355e38;  // bf16
  at::Tensor scores = at::cat({s_ctx, s_blk}, -1);
  const at::Tensor allowed =
      at::cat({context_mask(layout, sliding_window), block_mask(layout, sliding_window)}, -1);
  scores = scores.masked_fill(allowed.logical_not(), lowest);
  const at::Tensor p = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  at::Tensor out = at::matmul(p.narrow(-1, 0, S), v_ctx) +
                   at::matmul(p.narrow(-1, S, bs).reshape({B, num_heads, N, bs, bs}), v_blk)
                       .reshape({B, num_heads, Q, d});
  out = o_proj(out.transpose(1, 2).reshape({B, Q, num_heads * d}));
  const at::Tensor live = layout.keep.repeat_interleave(bs, 1).unsqueeze(-1);  // [B, Q, 1]
  return out.masked_fill(live.logical_not(), 0);
}

DFlashLayerImpl::DFlashLayerImpl(const DFlashConfig& cfg, int64_t layer) {
  const int64_t H = cfg.hidden_size();
  input_layernorm = register_module("input_layernorm", RMSNorm(H, cfg.core.rms_norm_eps));
  self_attn = register_module("self_attn", DFlashAttention(cfg, layer));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(H, cfg.core.rms_norm_eps));
  mlp = register_module("mlp", Eagle3MLP(H, cfg.core.intermediate_size));
}

at::Tensor DFlashLayerImpl::forward(const at::Tensor& x, const at::Tensor& ctx,
                                    const at::Tensor& cos, const at::Tensor& sin,
                                    const BlockLayout& layout) {
  at::Tensor h = x + self_attn(input_layernorm(x), ctx, cos, sin, layout);
  return h + mlp(post_attention_layernorm(h));
}

DFlashDraftImpl::DFlashDraftImpl(const DFlashConfig& cfg)
    : cfg_(cfg), rope_(cfg.core, cfg.core.max_position_embeddings + cfg.block_size) {
  const int64_t H = cfg.hidden_size();
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t k = 0; k < cfg.num_layers(); ++k) layers->push_back(DFlashLayer(cfg, k));
  norm = register_module("norm", RMSNorm(H, cfg.core.rms_norm_eps));
  fc = register_module("fc", make_linear(cfg.fc_in_features(), H, false));
  hidden_norm = register_module("hidden_norm", RMSNorm(H, cfg.core.rms_norm_eps));
}

std::vector<std::string> DFlashDraftImpl::unit_names() const {
  std::vector<std::string> out{"fc", "hidden_norm"};
  for (int64_t k = 0; k < cfg_.num_layers(); ++k) out.push_back("layers." + std::to_string(k));
  out.emplace_back("norm");
  return out;
}

void DFlashDraftImpl::normal_init(double std) {
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    const bool is_norm = name.find("norm.") != std::string::npos;
    if (is_norm) continue;  // RMSNorm weights stay one
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0)
      p.value().zero_();
    else
      p.value().normal_(0.0, std);
  }
}

std::pair<at::Tensor, at::Tensor> DFlashDraftImpl::positions(const BlockLayout& l,
                                                             c10::ScalarType dtype,
                                                             c10::Device device) {
  const int64_t S = l.context_len, bs = l.block_size, B = l.anchors.size(0);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor block =
      (l.anchors.unsqueeze(-1) + at::arange(bs, opts).view({1, 1, bs})).view({B, -1});
  const at::Tensor pos = at::cat({at::arange(S, opts).unsqueeze(0).expand({B, S}), block}, 1);
  const int64_t needed = std::max<int64_t>(S, pos.numel() ? pos.max().item<int64_t>() + 1 : 0);
  auto [cos, sin] = rope_.slice(0, needed, dtype, device);
  return {cos.index_select(0, pos.reshape(-1)).view({B, pos.size(1), -1}),
          sin.index_select(0, pos.reshape(-1)).view({B, pos.size(1), -1})};
}

at::Tensor DFlashDraftImpl::forward(const at::Tensor& noise, const at::Tensor& target_hidden,
                                    const BlockLayout& layout) {
  FSDP_CHECK(
      target_hidden.size(-1) == cfg_.fc_in_features(),
      fsdp::str("the features have width ", target_hidden.size(-1), ", the fc layer of ",
                cfg_.source, " reads ", cfg_.fc_in_features(), " (", cfg_.target_layer_ids.size(),
                " target layers x hidden size ", cfg_.hidden_size(), ")"),
      "the hidden states must come from the target layers the draft config names");
  const auto dtype = fc->weight.scalar_type();
  at::Tensor ctx = run_unit(hooks_, "fc", [&] { return fc(target_hidden.to(dtype)); });
  ctx = run_unit(hooks_, "hidden_norm", [&] { return hidden_norm(ctx); });
  auto [cos, sin] = positions(layout, dtype, noise.device());
  at::Tensor h = noise.to(dtype);
  for (size_t k = 0; k < layers->size(); ++k) {
    h = run_unit(hooks_, "layers." + std::to_string(k), [&] {
      return layers[k]->as<DFlashLayerImpl>()->forward(h, ctx, cos, sin, layout);
    });
  }
  return run_unit(hooks_, "norm", [&] { return norm(h); });
}

}  // namespace fsdp::model
