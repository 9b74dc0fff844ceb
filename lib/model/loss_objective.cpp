// The objective of one TTT step over its loss rows (loss_objective.h). The per-row values are
// written once (objective_terms) and read by both head passes: all rows at once, or chunks.
#include "model/loss_objective.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "kernels/fused.h"
#include "model/ttt_acceptance.h"

namespace fsdp::model {
namespace {

// -(sum_v p_nv * log_softmax(z_n)_v) for each of one step's rows ([N]), with z the logits in
// fp32 (fp64 for double logits) and p = target_p[take]. The forward and backward are exactly the
// kernels autograd runs for that composition, in the same order, so values and gradients are
// bit-identical to it; what differs is what the graph keeps until backward. Autograd would keep
// log_softmax's fp32 output and this step's gathered fp32 p, 8 bytes per logit; this keeps the
// logits in their own dtype (2 bytes in bf16) and the loss rows' target (shared by all steps),
// and recomputes log_softmax and the gather in backward. For the llama3-8B draft at S=2048 with
// every row a loss row: 3.7 GB -> 1.2 GB held per micro-batch over the 7 steps. Used when
// LossOptions::recompute_loss is set on the unchunked head (the chunked one recomputes anyway).
struct WeightedSoftCrossEntropy : torch::autograd::Function<WeightedSoftCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target_p, const at::Tensor& take) {
    const at::ScalarType acc = objective_dtype(logits);
    at::Tensor p = target_p.index_select(0, take).to(acc);
    ctx->save_for_backward({logits, target_p, take});
    return -(p * logits.to(acc).log_softmax(-1)).sum(-1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &target_p = saved[1], &take = saved[2];
    const at::ScalarType acc = objective_dtype(logits);
    at::Tensor z = logits.to(acc);
    at::Tensor logsm = z.log_softmax(-1);
    at::Tensor p = target_p.index_select(0, take).to(acc);
    // Autograd's chain for the composition: neg -> sum(-1) -> p * logsm -> log_softmax -> cast
    // back to the logits' dtype (the caller's pm * ce and sum run in autograd).
    at::Tensor g_logsm = grads[0].neg().unsqueeze(-1).expand(logsm.sizes()) * p;
    at::Tensor g_z = at::_log_softmax_backward_data(g_logsm, logsm, -1, acc);
    return {g_z.to(logits.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

// The same per-row soft cross-entropy in fsdp-train's CUDA kernels (kernels/fused.h): the forward
// reads each row's logits twice (log-sum-exp, then the weighted sum) and keeps the logits, the
// target, the rows and three floats per row; the backward writes the logits' gradient in one pass.
// Equal to the composite within fp32 rounding (tests/unit/model/fused_kernels.cpp). Callers check
// kernels::soft_ce_supported first.
struct FusedSoftCrossEntropy : torch::autograd::Function<FusedSoftCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target_p, const at::Tensor& take) {
    const at::Tensor rows = take.to(at::kLong);
    kernels::SoftCe r = kernels::soft_ce_forward(logits, target_p, rows);
    ctx->save_for_backward({logits, target_p, rows, r.row_max, r.log_sum, r.psum});
    return r.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = kernels::soft_ce_backward(grads[0], saved[0], saved[1], saved[2], saved[3],
                                             saved[4], saved[5]);
    return {g, at::Tensor(), at::Tensor()};
  }
};

// Whether the step's soft cross-entropy runs in the CUDA kernel: asked for, and the logits fit.
bool fused_soft_ce(const LossOptions& options, const at::Tensor& logits,
                   const at::Tensor& target_p) {
  return options.fused_kernels && options.loss_terms.empty() &&
         kernels::soft_ce_supported(logits, target_p);
}

// The differentiable values of rows `take` from their logits z [n, Vd]: the objective per row
// (soft_ce, or the weighted --loss-fn terms; not with LK alpha, which reads only the overlap)
// and, with LK, the overlap with the target's own probabilities of the draft tokens (target_p
// times draft_mass, not renormalised). z is cast to the objective's precision once, so every
// value's gradient reaches the logits through one cast. recompute: the recomputing soft
// cross-entropy (LossOptions::recompute_loss), for the unchunked head.
ScoredRows objective_terms(const at::Tensor& z, const RowsTarget& t, const at::Tensor& take,
                           const LossOptions& o, bool recompute) {
  const at::ScalarType acc = objective_dtype(z);
  at::Tensor zz, p;  // z and the target's rows in acc, made when a composite reads them
  const auto wide_z = [&]() -> const at::Tensor& {
    if (!zz.defined()) zz = z.to(acc);
    return zz;
  };
  const auto rows_p = [&]() -> const at::Tensor& {
    if (!p.defined()) p = t.target_p.index_select(0, take).to(acc);
    return p;
  };
  ScoredRows s;
  if (o.lk != LossOptions::LK::kAlpha) {
    if (fused_soft_ce(o, z, t.target_p)) {
      s.loss = FusedSoftCrossEntropy::apply(z, t.target_p, take);
    } else if (!o.loss_terms.empty()) {
      for (const auto& [term, weight] : o.loss_terms) {
        if (weight == 0) continue;
        at::Tensor v = row_loss(term, wide_z(), rows_p()) * weight;
        s.loss = s.loss.defined() ? s.loss + v : v;
      }
    } else if (recompute) {
      s.loss = WeightedSoftCrossEntropy::apply(z, t.target_p, take);
    } else {
      s.loss = -(rows_p() * wide_z().log_softmax(-1)).sum(-1);
    }
  }
  if (o.lk != LossOptions::LK::kNone) {
    at::Tensor p_on = rows_p();
    if (t.draft_mass.defined())
      p_on = p_on * t.draft_mass.index_select(0, take).to(acc).unsqueeze(-1);
    s.overlap = at::minimum(p_on, wide_z().softmax(-1)).sum(-1);
  }
  return s;
}

// objective_terms as one [k, n] tensor (the chunked head's values) and back.
at::Tensor stack_terms(const ScoredRows& s) {
  if (!s.overlap.defined()) return s.loss.unsqueeze(0);
  if (!s.loss.defined()) return s.overlap.unsqueeze(0);
  return at::stack({s.loss, s.overlap});
}
void unstack_terms(const at::Tensor& values, const LossOptions& o, ScoredRows& s) {
  if (o.lk != LossOptions::LK::kAlpha) s.loss = values[0];
  if (o.lk != LossOptions::LK::kNone) s.overlap = values[values.size(0) - 1];
}

// What no gradient reads of a chunk's logits: the argmax and the acceptance rows.
void inspect_rows(const at::Tensor& z, const RowsTarget& t, const at::Tensor& take,
                  std::vector<at::Tensor>& best, std::vector<at::Tensor>& accept) {
  best.push_back(z.argmax(-1));
  accept.push_back(acceptance_rows(z, t.target_p, t.draft_mass, take, objective_dtype(z)));
}

// All rows in one chunk: the logits [n, Vd] stay in the graph. The metrics read them in slices
// of accept_rate_chunk rows, so no more than that many rows are expanded at once.
ScoredRows whole_head(Eagle3DraftImpl& model, const at::Tensor& hidden, const RowsTarget& t,
                      const at::Tensor& take, const LossOptions& o) {
  const at::Tensor logits = model.logits(hidden);
  ScoredRows s = objective_terms(logits, t, take, o, o.recompute_loss);
  at::NoGradGuard guard;
  const at::Tensor z = logits.detach();
  const int64_t n = z.size(0), slice = accept_rate_chunk(std::max<int64_t>(z.size(-1), 1));
  std::vector<at::Tensor> best, accept;
  for (int64_t from = 0; from == 0 || from < n; from += slice) {
    const int64_t len = std::min(slice, n - from);
    inspect_rows(z.narrow(0, from, len), t, take.narrow(0, from, len), best, accept);
  }
  s.best = at::cat(best);
  s.accept = at::cat(accept, 1);
  return s;
}

// Chunks of `chunk` rows (Eagle3DraftImpl::head_rows): backward recomputes each chunk's
// logits and objective_terms.
ScoredRows chunked_head(Eagle3DraftImpl& model, const at::Tensor& hidden, const RowsTarget& t,
                        const at::Tensor& take, const LossOptions& o, int64_t chunk) {
  std::vector<at::Tensor> best, accept;
  Eagle3DraftImpl::HeadFns fns;
  fns.values = [t, take, o](const at::Tensor& z, int64_t from) {
    return stack_terms(objective_terms(z, t, take.narrow(0, from, z.size(0)), o, false));
  };
  fns.inspect = [&](const at::Tensor& z, int64_t from) {
    inspect_rows(z, t, take.narrow(0, from, z.size(0)), best, accept);
  };
  ScoredRows s;
  unstack_terms(model.head_rows(hidden, chunk, fns), o, s);
  s.best = at::cat(best);
  s.accept = at::cat(accept, 1);
  return s;
}

}  // namespace

at::ScalarType objective_dtype(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

ScoredRows score_rows(Eagle3DraftImpl& model, const at::Tensor& hidden, const RowsTarget& target,
                      const at::Tensor& take, const LossOptions& options, int64_t chunk) {
  return chunk > 0 ? chunked_head(model, hidden, target, take, options, chunk)
                   : whole_head(model, hidden, target, take, options);
}

at::Tensor head_argmax(Eagle3DraftImpl& model, const at::Tensor& hidden, int64_t chunk) {
  if (chunk > 0) {
    std::vector<at::Tensor> parts;
    Eagle3DraftImpl::HeadFns fns;
    fns.inspect = [&](const at::Tensor& z, int64_t) { parts.push_back(z.argmax(-1)); };
    model.head_rows(hidden, chunk, fns);
    return at::cat(parts);
  }
  at::Tensor logits = model.logits(hidden);
  at::NoGradGuard guard;
  return logits.argmax(-1);
}

at::Tensor step_ploss(const ScoredRows& s, const at::Tensor& weight, const LossUnits& units,
                      const StepNormalizer& norm, const LossNormalizers& all,
                      const LossOptions& options) {
  const at::ScalarType acc = (s.loss.defined() ? s.loss : s.overlap).scalar_type();
  const at::Tensor pm = weight.to(acc);
  if (options.lk == LossOptions::LK::kAlpha) {
    // SpecForge's alpha: -mean log a over the position rows (a = 0 rows add nothing).
    const at::Tensor& a = s.overlap;
    const at::Tensor loga = at::where(a > 0, a.clamp_min(1e-30).log(), at::zeros_like(a));
    return units.total(-units.sum(pm * loga) / norm.lk_denominator(acc));
  }
  at::Tensor ploss = norm.divide(units.sum(pm * s.loss));
  if (options.lk == LossOptions::LK::kLambda) {
    // w from the sample's mean acceptance (sequence-parallel: the group's shares summed),
    // outside the gradient; this rank's share of 1 - mean a, so the group's shares sum to the
    // sample's ploss_i.
    const at::Tensor mean_a = units.sum(pm * s.overlap) / norm.lk_denominator(acc);
    at::Tensor mean_all = mean_a.detach();
    if (all.group) {
      mean_all = mean_all.clone().contiguous();
      all.group->all_reduce_sum(mean_all);
    }
    const at::Tensor w = options.kl_scale * (-options.kl_decay * mean_all).exp();
    ploss = w * ploss + (1.0 - w) * (1.0 / static_cast<double>(all.group_size) - mean_a);
  }
  return units.total(ploss);
}

}  // namespace fsdp::model
