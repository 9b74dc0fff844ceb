// DFlash's block objective (model/dflash_objective.h).
#include "model/dflash_objective.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "model/block_acceptance.h"
#include "model/chunk_reduce.h"

namespace fsdp::model {
namespace {

// The D-PACE position weights (detached): p the draft's probability of each label.
at::Tensor dpace_weight(const at::Tensor& p, const at::Tensor& weight, BlockLoss loss,
                        double alpha) {
  at::Tensor smooth = (1.0 - alpha) * p + alpha;
  smooth = at::where(weight > 0, smooth, at::ones_like(smooth));
  const at::Tensor prefix = at::cumprod(smooth, -1);
  if (loss == BlockLoss::kDPaceCumulativeConfidence) return prefix;
  const at::Tensor suffix = at::flip(at::cumsum(at::flip(prefix * weight, {-1}), -1), {-1});
  if (loss == BlockLoss::kDPace) return suffix;
  const double tiny = prefix.scalar_type() == at::kDouble ? std::numeric_limits<double>::min()
                                                          : std::numeric_limits<float>::min();
  return suffix / prefix.clamp_min(tiny);
}

at::Tensor decay(int64_t bs, double gamma, const at::TensorOptions& opts) {
  const at::Tensor k = at::arange(bs, opts.dtype(at::kLong));
  return at::exp(-(k - 1).clamp_min(0).to(opts.dtype()) / gamma).view({1, 1, bs});
}

}  // namespace

DFlashTerms dflash_objective(const at::Tensor& hidden4d, const BlockLabels& labels,
                             const at::Tensor& lm_head_weight, const DFlashObjectiveOptions& o) {
  const auto wide = hidden4d.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const ChunkTermsFn fn = [&o, wide](const std::vector<at::Tensor>& s,
                                     const std::vector<at::Tensor>& p) {
    const at::Tensor& hidden = s[0];
    const at::Tensor& target = s[1];
    const at::Tensor weight = s[2].to(wide);
    const int64_t B = hidden.size(0), N = hidden.size(1), bs = hidden.size(2), H = hidden.size(3);
    at::Tensor num, den, pred;
    if (o.loss == BlockLoss::kDFlash) {
      // Only the positions with a weight reach the vocabulary (the anchor's own position, the
      // positions past a reply and the padding blocks weigh 0 and change nothing): the loss, its
      // gradient and every metric below read nothing else (accepted_prefix and the accuracy
      // mask the other positions out). pred is -1 elsewhere.
      at::Tensor w = weight;
      if (o.decay_gamma && *o.decay_gamma > 0) w = w * decay(bs, *o.decay_gamma, weight.options());
      const at::Tensor rows = weight.reshape(-1).gt(0).nonzero().squeeze(-1);
      const at::Tensor logits = at::matmul(hidden.reshape({-1, H}).index_select(0, rows), p[0].t());
      const at::Tensor logp = at::log_softmax(logits.to(wide), -1);
      const at::Tensor nlq =
          -logp.gather(-1, target.reshape(-1).index_select(0, rows).unsqueeze(-1)).squeeze(-1);
      num = (nlq * w.reshape(-1).index_select(0, rows)).sum();
      den = w.sum();
      at::NoGradGuard no_grad;
      pred = at::full({B * N * bs}, -1, target.options())
                 .index_copy_(0, rows, logits.argmax(-1))
                 .view({B, N, bs});
    } else {
      const at::Tensor logits =
          at::matmul(hidden.reshape({B, N * bs, H}), p[0].t()).view({B, N, bs, -1});
      const at::Tensor logp = at::log_softmax(logits.to(wide), -1);
      const at::Tensor nlq = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1);
      at::Tensor dw;
      {
        at::NoGradGuard no_grad;
        dw = dpace_weight(at::exp(-nlq), weight, o.loss, o.dpace_alpha);
      }
      num = (nlq * weight * dw).sum();
      den = at::zeros({}, weight.options());
      at::NoGradGuard no_grad;
      pred = logits.argmax(-1);
    }
    at::NoGradGuard no_grad;
    const at::Tensor valid = weight > 0;
    const at::Tensor correct = (pred.eq(target) & (weight > 0.5)).sum().to(wide);
    const at::Tensor blocks = valid.any(-1);
    const at::Tensor accepted = accepted_prefix(pred, target, valid, /*first=*/1);
    if (o.accepted_blocks) o.accepted_blocks->push_back(accepted);
    return std::vector<at::Tensor>{num,
                                   den,
                                   correct,
                                   weight.sum(),
                                   ((accepted + 1) * blocks).sum().to(wide),
                                   blocks.sum().to(wide)};
  };
  // The loss differentiates loss_num alone (term 0).
  const at::Tensor t = chunk_reduce(fn, {hidden4d, labels.target_ids, labels.weight},
                                    {lm_head_weight}, o.chunk_blocks, 1, {1.0});
  DFlashTerms out;
  out.loss_num = t[0];
  out.loss_den = t[1].detach();
  out.correct = t[2].detach();
  out.accuracy_den = t[3].detach();
  out.accept_num = t[4].detach();
  out.accept_den = t[5].detach();
  return out;
}

}  // namespace fsdp::model
