// Target distribution from the target LM head (docs/reference.md §4). The tiled path multiplies
// only the t2d rows for target_p and walks the full vocabulary in tiles for the argmax; the dense
// path is the straightforward [B, S, V] reference. Never builds a graph: everything runs without
// grad.
#include "model/target_head.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace fsdp::model {
namespace {

constexpr int64_t kTileElements = int64_t{16} << 20;  // one tile's logits: at most 16 Mi elements

// Pads target_p [B, S, Vd] with T rows of 1/Vd (docs/reference.md §4: steps past the end see
// uniform targets).
at::Tensor pad_uniform(const at::Tensor& p, int64_t T) {
  if (T == 0) return p;
  at::Tensor pad =
      at::full({p.size(0), T, p.size(2)}, 1.0 / static_cast<double>(p.size(2)), p.options());
  return at::cat({p, pad}, 1);
}

}  // namespace

TargetHead::TargetHead(const at::Tensor& lm_head_weight, const at::Tensor& t2d) {
  FSDP_CHECK(lm_head_weight.dim() == 2,
             fsdp::str("target lm_head must be [V, H], got ", lm_head_weight.sizes()),
             "check --lm-head-key");
  FSDP_CHECK(t2d.dim() == 1 && t2d.size(0) == lm_head_weight.size(0),
             fsdp::str("t2d has ", t2d.numel(), " entries, the target lm_head has ",
                       lm_head_weight.size(0), " rows"),
             "the vocab mapping must be built for this target model's vocabulary");
  weight_ = lm_head_weight.detach().contiguous();
  t2d_ = t2d.to(at::kBool).to(weight_.device());
  draft_weight_ = weight_.index({t2d_}).contiguous();
  FSDP_CHECK(draft_weight_.size(0) > 0, "t2d marks no token", "rebuild the vocab mapping");
}

int64_t TargetHead::auto_vocab_tile(int64_t rows, int64_t vocab) {
  const int64_t fit = kTileElements / std::max<int64_t>(rows, 1) / 256 * 256;
  return std::min(std::max<int64_t>(fit, 1024), vocab);
}

void TargetHead::to(c10::Device device) {
  weight_ = weight_.to(device);
  draft_weight_ = draft_weight_.to(device);
  t2d_ = t2d_.to(device);
}

at::Tensor TargetHead::tiled_argmax(const at::Tensor& hidden, int64_t vocab_tile) const {
  return tiled_argmax_lse(hidden, vocab_tile, /*want_lse=*/false).first;
}

std::pair<at::Tensor, at::Tensor> TargetHead::tiled_argmax_lse(const at::Tensor& hidden,
                                                               int64_t vocab_tile,
                                                               bool want_lse) const {
  at::NoGradGuard guard;
  const int64_t V = weight_.size(0);
  at::Tensor x = hidden.to(weight_.scalar_type()).reshape({-1, hidden.size(-1)});
  const int64_t tile = vocab_tile > 0 ? std::min(vocab_tile, V) : auto_vocab_tile(x.size(0), V);
  at::Tensor best_val, best_idx, lse;
  for (int64_t v0 = 0; v0 < V; v0 += tile) {
    const int64_t n = std::min(tile, V - v0);
    at::Tensor logits = at::matmul(x, weight_.narrow(0, v0, n).t());  // [rows, n], weight dtype
    if (want_lse) {
      at::Tensor part = logits.to(at::kFloat).logsumexp(-1);
      lse = lse.defined() ? at::logaddexp(lse, part) : part;
    }
    auto [val, idx] = logits.max(-1);
    idx = idx + v0;
    if (!best_val.defined()) {
      best_val = val;
      best_idx = idx;
    } else {
      // Strictly greater: on ties the earlier tile (smaller id) wins, as at::argmax does.
      at::Tensor better = val > best_val;
      best_val = at::where(better, val, best_val);
      best_idx = at::where(better, idx, best_idx);
    }
  }
  auto sizes = hidden.sizes().vec();
  sizes.pop_back();
  return {best_idx.view(sizes), want_lse ? lse.view(sizes) : at::Tensor()};
}

TargetHead::DraftLogits TargetHead::draft_logits_and_ids(const at::Tensor& hidden, TargetImpl impl,
                                                         int64_t vocab_tile, bool want_lse) const {
  at::NoGradGuard guard;
  at::Tensor x = hidden.to(weight_.scalar_type());
  if (impl == TargetImpl::kDense) {
    at::Tensor logits = at::matmul(x, weight_.t());  // [..., V]
    return {logits.index({at::indexing::Ellipsis, t2d_}), logits.argmax(-1),
            want_lse ? logits.to(at::kFloat).logsumexp(-1) : at::Tensor()};
  }
  // [..., Vd] in the weight dtype; the full-vocab argmax (and log-sum-exp) in tiles.
  auto [ids, lse] = tiled_argmax_lse(x, vocab_tile, want_lse);
  return {at::matmul(x, draft_weight_.t()), ids, lse};
}

TargetDistribution TargetHead::compute_with(const at::Tensor& target_hidden,
                                            const at::Tensor& loss_mask, int64_t ttt_length,
                                            TargetImpl impl, int64_t vocab_tile) const {
  at::NoGradGuard guard;
  TargetDistribution out;
  const DraftLogits d = draft_logits_and_ids(target_hidden, impl, vocab_tile);
  out.target_p = pad_uniform(d.logits.to(at::kFloat).softmax(-1), ttt_length);
  out.target_ids = d.ids;
  out.position_mask = loss_mask.to(at::kLong) * t2d_.index({out.target_ids}).to(at::kLong);
  return out;
}

TargetDistribution TargetHead::compute_tiled(const at::Tensor& target_hidden,
                                             const at::Tensor& loss_mask, int64_t ttt_length,
                                             int64_t vocab_tile) const {
  return compute_with(target_hidden, loss_mask, ttt_length, TargetImpl::kTiled, vocab_tile);
}

TargetDistribution TargetHead::compute_dense(const at::Tensor& target_hidden,
                                             const at::Tensor& loss_mask,
                                             int64_t ttt_length) const {
  return compute_with(target_hidden, loss_mask, ttt_length, TargetImpl::kDense, 0);
}

void TargetHead::check_hidden(const at::Tensor& target_hidden) const {
  FSDP_CHECK(weight_.defined(), "TargetHead used before construction",
             "build it from the target lm_head weight and t2d");
  FSDP_CHECK(
      target_hidden.dim() == 3 && target_hidden.size(-1) == weight_.size(1),
      fsdp::str("target_hidden must be [B, S, ", weight_.size(1), "], got ", target_hidden.sizes()),
      "the hidden states must come from the target whose lm_head was loaded");
}

RowTarget TargetHead::compute_rows(const at::Tensor& target_hidden, const at::Tensor& rows,
                                   TargetImpl impl, int64_t vocab_tile, bool want_mass) const {
  check_hidden(target_hidden);
  FSDP_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong,
             fsdp::str("rows must be int64 [N], got ", rows.scalar_type(), " ", rows.sizes()),
             "build them with LossRows::build");
  at::NoGradGuard guard;
  at::Tensor x = target_hidden.reshape({-1, weight_.size(1)}).index_select(0, rows);  // [N, H]
  RowTarget out;
  const DraftLogits d = draft_logits_and_ids(x, impl, vocab_tile, want_mass);
  out.target_ids = d.ids;
  out.target_p = d.logits.to(at::kFloat).softmax(-1);
  if (want_mass) out.draft_mass = (d.logits.to(at::kFloat).logsumexp(-1) - d.lse).exp();
  out.in_draft = t2d_.index({out.target_ids}).to(at::kLong);
  out.target_best = out.target_p.argmax(-1);
  return out;
}

TargetDistribution TargetHead::compute(const at::Tensor& target_hidden, const at::Tensor& loss_mask,
                                       int64_t ttt_length, TargetImpl impl,
                                       int64_t vocab_tile) const {
  check_hidden(target_hidden);
  FSDP_CHECK(loss_mask.dim() == 2 && loss_mask.size(0) == target_hidden.size(0) &&
                 loss_mask.size(1) == target_hidden.size(1),
             fsdp::str("loss_mask ", loss_mask.sizes(), " does not match target_hidden ",
                       target_hidden.sizes()),
             "pass the batch's loss_mask");
  FSDP_CHECK(ttt_length >= 0, fsdp::str("ttt_length ", ttt_length, " is negative"),
             "use --ttt-length >= 1");
  return impl == TargetImpl::kDense
             ? compute_dense(target_hidden, loss_mask, ttt_length)
             : compute_tiled(target_hidden, loss_mask, ttt_length, vocab_tile);
}

}  // namespace fsdp::model
