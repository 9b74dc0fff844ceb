// The TTT unroll and its loss (docs/reference.md §3.2, §5). Metrics stay on the device as tensors:
// nothing here synchronises with the host unless LossOptions::check_padding asks for it.
#include "model/ttt_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/fused.h"
#include "model/memory_estimate.h"
#include "model/seq_parallel.h"

namespace fsdp::model {
namespace {

// A sequence-parallel rank's draft positions [offset, offset + local) (LossRows::build_shard).
struct ShardSpan {
  int64_t offset = 0, local = 0;
};
LossRows build_rows(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                    const std::vector<int64_t>& documents, const ShardSpan* shard);

void check_batch(const Eagle3DraftImpl& model, const at::Tensor& input_ids,
                 const at::Tensor& attention_mask, const at::Tensor& loss_mask,
                 const at::Tensor& aux_hidden, int64_t T) {
  FSDP_CHECK(input_ids.dim() == 2, fsdp::str("input_ids must be [B, S], got ", input_ids.sizes()),
             "collate samples into a [B, S] batch");
  const int64_t B = input_ids.size(0), S = input_ids.size(1);
  FSDP_CHECK(input_ids.scalar_type() == at::kLong,
             fsdp::str("input_ids must be int64, got ", input_ids.scalar_type()),
             "convert with .to(kLong)");
  for (auto [name, t] :
       {std::pair<const char*, const at::Tensor*>{"attention_mask", &attention_mask},
        {"loss_mask", &loss_mask}}) {
    FSDP_CHECK(t->dim() == 2 && t->size(0) == B && t->size(1) == S,
               fsdp::str(name, " must be [", B, ", ", S, "] like input_ids, got ", t->sizes()),
               "every batch tensor is padded to the same [B, S]");
  }
  FSDP_CHECK(aux_hidden.dim() == 3 && aux_hidden.size(0) == B && aux_hidden.size(1) == S &&
                 aux_hidden.size(2) == model.config().fc_in_features(),
             fsdp::str("aux_hidden must be [", B, ", ", S, ", ", model.config().fc_in_features(),
                       "], got ", aux_hidden.sizes()),
             "the hidden states must come from the target this draft config describes");
  FSDP_CHECK(T >= 1, fsdp::str("ttt_length must be >= 1, got ", T), "use --ttt-length 7 (default)");
}

// Runs the T-step unroll and hands each step's output (Eagle3DraftImpl::step_output: the last
// layer's out, normed with norm_output) to `on_step`; it is also the next step's hidden state.
//
// Sequence-parallel (layout.shard), input_ids and aux_hidden hold the window of the shard's
// LossRows (local + T - 1 positions); the draft runs on the first `local` of them and step i
// embeds the tokens i positions on (the window's last T - 1 are the next ranks' first ones).
void unroll(Eagle3DraftImpl& model, const at::Tensor& input_ids, const SeqLayout& layout,
            const at::Tensor& aux_hidden, int64_t T, AttentionImpl impl,
            const std::function<void(int64_t, const at::Tensor&)>& on_step) {
  const int64_t L = layout.shard ? layout.shard->local : input_ids.size(1);
  model.begin_unroll();  // a new count of the projections' uses (model/linear_grad.h)
  // Step-0 hidden, computed once.
  at::Tensor h = model.project_aux(layout.shard ? aux_hidden.narrow(1, 0, L) : aux_hidden);
  DraftCache cache;
  for (int64_t i = 0; i < T; ++i) {
    at::Tensor e = model.embed(layout.shard ? input_ids.narrow(1, i, L) : shift_left(input_ids, i));
    at::Tensor out = model.step_output(model.decode(e, h, i, cache, layout, impl));
    on_step(i, out);
    h = out;
  }
}

// -(sum_v p_nv * log_softmax(z_n)_v) for each of one step's rows ([N]), with z the logits in
// fp32 (fp64 for double logits) and p = target_p[take]. The forward and backward are exactly the
// kernels autograd runs for that composition, in the same order, so values and gradients are
// bit-identical to it; what differs is what the graph keeps until backward. Autograd would keep
// log_softmax's fp32 output and this step's gathered fp32 p, 8 bytes per logit; this keeps the
// logits in their own dtype (2 bytes in bf16) and the loss rows' target (shared by all steps),
// and recomputes log_softmax and the gather in backward. For the llama3-8B draft at S=2048 with
// every row a loss row: 3.7 GB -> 1.2 GB held per micro-batch over the 7 steps. Used when
// LossOptions::recompute_loss is set; otherwise the composition itself runs (no recomputation).
struct WeightedSoftCrossEntropy : torch::autograd::Function<WeightedSoftCrossEntropy> {
  static at::ScalarType wide(const at::Tensor& logits) {
    return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target_p, const at::Tensor& take) {
    const at::ScalarType acc = wide(logits);
    at::Tensor p = target_p.index_select(0, take).to(acc);
    ctx->save_for_backward({logits, target_p, take});
    return -(p * logits.to(acc).log_softmax(-1)).sum(-1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &target_p = saved[1], &take = saved[2];
    const at::ScalarType acc = wide(logits);
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

// The target on the loss rows: target_p [N, Vd], the full-vocabulary argmax target_ids [N],
// position_mask0 at those rows, and the full-vocabulary argmax at LossRows::pre, pre_ids [R].
struct RowsTarget {
  at::Tensor target_p, target_ids, position, pre_ids;
  at::Tensor draft_mass;  // fp32 [N] or undefined (1)
};

// Rows per chunk of the expected-acceptance sum: at most 16 Mi elements of [rows, Vd] at once.
int64_t accept_rate_chunk(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t{1} << 24) / vocab);
}

// sum_v min(p_nv, q_nv) per row ([2, n]), q = softmax of the logits in `acc` precision: row 0
// with p the target's own probabilities of the draft tokens, target_p[take] times draft_mass
// (SpecForge's acceptance; the mass taken as 1 when undefined), row 1 with p = target_p[take]
// (renormalised over the draft vocabulary).
at::Tensor acceptance_rows(const at::Tensor& logits, const at::Tensor& target_p,
                           const at::Tensor& draft_mass, const at::Tensor& take,
                           at::ScalarType acc) {
  at::Tensor q = logits.to(acc).softmax(-1);
  at::Tensor p = target_p.index_select(0, take).to(acc);
  at::Tensor renorm = at::minimum(p, q).sum(-1);
  if (!draft_mass.defined()) return at::stack({renorm, renorm});
  at::Tensor own = p * draft_mass.index_select(0, take).to(acc).unsqueeze(-1);
  return at::stack({at::minimum(own, q).sum(-1), renorm});
}

// sum_n pm_n * row(from, len)_n ([2]), summed in chunks of accept_rate_chunk(vocab) rows (row
// gives acceptance_rows of rows from .. from + len - 1), so no more than that many rows are
// expanded at once; the chunked head passes its rows computed already, with the same sums.
template <class RowFn>
at::Tensor sum_acceptance(int64_t n, int64_t vocab, const at::Tensor& pm, RowFn row) {
  at::Tensor sum = at::zeros({2}, pm.options());
  const int64_t chunk = accept_rate_chunk(std::max<int64_t>(vocab, 1));
  for (int64_t from = 0; from < n; from += chunk) {
    const int64_t len = std::min(chunk, n - from);
    sum = sum + (row(from, len) * pm.narrow(0, from, len)).sum(-1);
  }
  return sum;
}

// Both sums_n pm_n * sum_v min(p_nv, q_nv) of acceptance_rows ([2]) over the step's logits.
at::Tensor expected_acceptance(const at::Tensor& logits, const at::Tensor& target_p,
                               const at::Tensor& draft_mass, const at::Tensor& take,
                               const at::Tensor& pm, at::ScalarType acc) {
  return sum_acceptance(logits.size(0), logits.size(-1), pm, [&](int64_t from, int64_t len) {
    return acceptance_rows(logits.narrow(0, from, len), target_p, draft_mass,
                           take.narrow(0, from, len), acc);
  });
}

// Hits of step i: the draft argmax mapped to a target id through d2t equals the target id.
at::Tensor d2t_hits(const at::Tensor& best, const at::Tensor& d2t, const at::Tensor& target_ids) {
  return (best + d2t.index_select(0, best)).eq(target_ids);
}

// The per-row values of the step's objective from the logits z [n, Vd] of loss rows `take`:
// row 0 the loss of each row (soft_ce, or the weighted terms), row 1 with LK the acceptance
// against the target's own probabilities (target_p times draft_mass): [1 or 2, n]. The same
// operations per row as the unchunked path: chunked values differ only as their logits do.
at::Tensor objective_rows(const at::Tensor& z, const at::Tensor& target_p,
                          const at::Tensor& draft_mass, const at::Tensor& take,
                          const LossOptions& options) {
  const at::ScalarType acc = WeightedSoftCrossEntropy::wide(z);
  const bool fused = fused_soft_ce(options, z, target_p);
  at::Tensor p, zz, per_row;
  if (!fused || options.lk != LossOptions::LK::kNone) {
    p = target_p.index_select(0, take).to(acc);
    zz = z.to(acc);
  }
  if (fused) {
    per_row = FusedSoftCrossEntropy::apply(z, target_p, take);
  } else if (options.loss_terms.empty()) {
    per_row = -(p * zz.log_softmax(-1)).sum(-1);
  } else {
    for (const auto& [term, weight] : options.loss_terms) {
      if (weight == 0) continue;
      at::Tensor v = row_loss(term, zz, p) * weight;
      per_row = per_row.defined() ? per_row + v : v;
    }
  }
  if (options.lk == LossOptions::LK::kNone) return per_row.unsqueeze(0);
  at::Tensor p_on = p;
  if (draft_mass.defined()) p_on = p * draft_mass.index_select(0, take).to(acc).unsqueeze(-1);
  return at::stack({per_row, at::minimum(p_on, zz.softmax(-1)).sum(-1)});
}

// The engine's drafts over LossRows' nodes (see LossRows::engine_hit): each node's accepted
// count n (leading hits), the jump to the node n + 1 rows later, and the nodes reached from
// each reply's first node, by pointer doubling (ceil(log2(M + 1)) gather/scatter rounds on the
// device, no host sync). Returns {sum of n over the reached nodes, number of reached nodes}.
//
// Sequence-parallel (group set): each rank counts its own nodes' n; the counts are summed over
// the group, every rank follows the chains of the whole sample and rank 0 reports them.
std::pair<at::Tensor, at::Tensor> engine_chains(const LossRows& rows,
                                                const std::vector<at::Tensor>& hits,
                                                const at::Tensor& pre_hit, int64_t T,
                                                SeqGroup* group) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(rows.rows.device());
  const int64_t M = rows.engine_nodes;
  if (M == 0) return {at::zeros({}, f32), at::zeros({}, f32)};
  const int64_t R = rows.pre.numel(), M_loc = group ? rows.engine_local : M;
  at::Tensor alive = at::ones({M_loc}, f32), n = at::zeros({M_loc}, f32);
  for (int64_t i = 0; i < T; ++i) {
    at::Tensor all = at::cat({hits[static_cast<size_t>(i)], i == 0 ? pre_hit : at::zeros({R}, f32),
                              at::zeros({1}, f32)});
    alive.mul_(all.index_select(0, rows.engine_hit[static_cast<size_t>(i)]));
    n.add_(alive);
  }
  if (group) {
    at::Tensor whole = at::zeros({M}, f32);
    whole.narrow(0, rows.engine_first, M_loc).copy_(n);
    group->all_reduce_sum(whole);
    n = whole;
  }
  const auto i64 = f32.dtype(at::kLong);
  at::Tensor next = at::arange(M, i64) + n.to(at::kLong) + 1;
  next = at::where(next.lt(rows.engine_end), next, at::full({}, M, i64));
  at::Tensor jump = at::cat({next, at::full({1}, M, i64)});  // node M: past every reply
  at::Tensor reached = at::zeros({M + 1}, f32).index_fill_(0, rows.engine_start, 1.0);
  for (int64_t span = 1; span <= M; span *= 2) {
    // Reached now: the nodes 0 .. 2*span-1 jumps after a first node.
    reached = reached.index_add(0, jump, reached).clamp_max_(1.0);
    jump = jump.index_select(0, jump);
  }
  at::Tensor drafts = reached.narrow(0, 0, M);
  if (group && group->rank() != 0) return {at::zeros({}, f32), at::zeros({}, f32)};
  return {(drafts * n).sum(), drafts.sum()};
}

// The unroll and loss on the loss rows only (see LossRows).
StepOutput step_on_rows(Eagle3DraftImpl& model, const RowsTarget& target, const LossRows& rows,
                        const at::Tensor& input_ids, const at::Tensor& attention_mask,
                        const at::Tensor& aux_hidden, const LossOptions& options) {
  const int64_t T = options.ttt_length, B = rows.batch, S = rows.seq;
  FSDP_CHECK(options.accumulation_steps >= 1,
             fsdp::str("accumulation_steps must be >= 1, got ", options.accumulation_steps),
             "global batch / (dp size * micro batch) is at least 1");
  FSDP_CHECK(rows.ttt_length >= T && B == input_ids.size(0) && S == input_ids.size(1),
             fsdp::str("loss rows were built for [", B, ", ", S, "] and ", rows.ttt_length,
                       " steps; the batch is ", input_ids.sizes(), " with ", T, " steps"),
             "build LossRows from this batch's loss_mask and the same ttt_length");
  if (options.check_padding) check_right_padded(attention_mask);
  // Sequence-parallel: this rank's slice (seq_parallel.h). The loss sums below are this rank's
  // share of the sample's; every normaliser is the sample's.
  std::shared_ptr<SeqShard> shard;
  SeqLayout layout(attention_mask, rows.documents);
  int64_t P = 1;
  if (rows.sharded()) {
    FSDP_CHECK(options.seq_group != nullptr && B == 1,
               fsdp::str("sequence-parallel loss rows for a [", B, ", ", S, "] batch without ",
                         options.seq_group ? "micro-batch 1" : "a sequence-parallel group"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    P = options.seq_group->size();
    shard = std::make_shared<SeqShard>();
    shard->group = options.seq_group;
    shard->offset = rows.shard_offset;
    shard->local = rows.shard_local;
    shard->total = rows.shard_total;
    shard->full_mask = at::arange(shard->padded(), input_ids.options())
                           .lt(rows.shard_total)
                           .to(at::kLong)
                           .unsqueeze(0);
    layout = SeqLayout(attention_mask.narrow(1, 0, rows.shard_local));
    layout.shard = shard;
  }
  const bool sp = shard != nullptr;

  StepOutput res;
  res.batch = B;
  res.seq = sp ? rows.shard_total : S;
  std::vector<at::Tensor> ploss, correct, loss_tokens, position_tokens, accept_rate, accept_renorm;
  std::vector<at::Tensor> hits;  // step i: fp32 [N], the hit at each loss row
  at::Tensor total, pre_hit;
  const int64_t N = rows.rows.numel();
  const at::Tensor d2t = model.d2t.to(at::kLong);
  const int64_t Vd = model.config().draft_vocab();
  // Chunked or not, for the whole micro-batch (steps after 0 have at most N rows).
  const int64_t chunk = head_chunk_rows(options.head_chunk_rows, N, Vd);
  std::vector<at::Tensor> batch_acc;  // packed: step i's sum over documents of their acc_i
  // Sequence-parallel: the sample's position-mask sum of every step (the per-token and LK
  // normalisers), summed over the group once before the unroll.
  at::Tensor pm_total;
  if (sp && (options.normalization == LossNormalization::kValidTokens ||
             options.lk != LossOptions::LK::kNone)) {
    at::NoGradGuard guard;
    std::vector<at::Tensor> sums;
    for (int64_t i = 0; i < T; ++i)
      sums.push_back(target.position.index_select(0, rows.target[static_cast<size_t>(i)])
                         .to(at::kDouble)
                         .sum());
    pm_total = at::stack(sums).contiguous();
    options.seq_group->all_reduce_sum(pm_total);
  }
  unroll(
      model, input_ids, layout, aux_hidden, T, options.attention,
      [&](int64_t i, const at::Tensor& out) {
        const at::Tensor& take = rows.target[static_cast<size_t>(i)];
        at::Tensor hidden =
            out.reshape({-1, out.size(-1)}).index_select(0, rows.draft[static_cast<size_t>(i)]);
        // Chunked: the head's values per row, the argmax and the acceptance rows read from each
        // chunk's logits, none of them kept. Unchunked: the step's logits [N_i, Vd].
        at::Tensor logits, values, best, accept_rows;
        if (chunk > 0) {
          std::vector<at::Tensor> best_parts, accept_parts;
          Eagle3DraftImpl::HeadFns fns;
          fns.values = [target_p = target.target_p, mass = target.draft_mass, take, options](
                           const at::Tensor& z, int64_t from) {
            return objective_rows(z, target_p, mass, take.narrow(0, from, z.size(0)), options);
          };
          fns.inspect = [&](const at::Tensor& z, int64_t from) {
            best_parts.push_back(z.argmax(-1));
            accept_parts.push_back(acceptance_rows(z, target.target_p, target.draft_mass,
                                                   take.narrow(0, from, z.size(0)),
                                                   WeightedSoftCrossEntropy::wide(z)));
          };
          values = model.head_rows(hidden, chunk, fns);
          best = at::cat(best_parts);
          accept_rows = at::cat(accept_parts, 1);
        } else {
          logits = model.logits(hidden);  // [N_i, Vd]
        }
        const at::ScalarType acc =
            values.defined() ? values.scalar_type() : WeightedSoftCrossEntropy::wide(logits);
        at::Tensor pm = target.position.index_select(0, take).to(acc);
        // The objective of each row ([N_i], differentiable).
        at::Tensor vals;
        if (values.defined()) {
          vals = values[0];
        } else if (!options.loss_terms.empty()) {
          at::Tensor p = target.target_p.index_select(0, take).to(acc);
          at::Tensor z = logits.to(acc);
          for (const auto& [term, weight] : options.loss_terms) {
            if (weight == 0) continue;
            at::Tensor v = row_loss(term, z, p) * weight;
            vals = vals.defined() ? vals + v : v;
          }
        } else if (fused_soft_ce(options, logits, target.target_p)) {
          vals = FusedSoftCrossEntropy::apply(logits, target.target_p, take);
        } else if (options.recompute_loss) {
          vals = WeightedSoftCrossEntropy::apply(logits, target.target_p, take);
        } else {
          at::Tensor p = target.target_p.index_select(0, take).to(acc);
          vals = -(p * logits.to(acc).log_softmax(-1)).sum(-1);
        }
        // SpecForge's LK: the acceptance against the target's own probabilities of the draft
        // tokens (not renormalised), per position row.
        at::Tensor a;
        if (options.lk != LossOptions::LK::kNone) {
          if (values.defined()) {
            a = values[1];
          } else {
            at::Tensor p_on = target.target_p.index_select(0, take).to(acc);
            if (target.draft_mass.defined())
              p_on = p_on * target.draft_mass.index_select(0, take).to(acc).unsqueeze(-1);
            a = at::minimum(p_on, logits.to(acc).softmax(-1)).sum(-1);
          }
        }
        at::Tensor pm_sum = pm.sum();
        // The sample's sum of the position mask (sequence-parallel: over the group).
        const at::Tensor pm_all = sp && pm_total.defined() ? pm_total[i].to(acc) : pm_sum;
        at::Tensor ploss_i;
        if (!rows.packed()) {
          at::Tensor sum = (pm * vals).sum();
          ploss_i = options.normalization == LossNormalization::kBatchTokens
                        ? sum / static_cast<double>(B * res.seq)
                        : sum / pm_all.clamp_min(1.0);
          if (options.lk != LossOptions::LK::kNone) {
            const at::Tensor den = pm_all.clamp_min(1e-8);
            if (options.lk == LossOptions::LK::kAlpha) {
              const at::Tensor loga = at::where(a > 0, a.clamp_min(1e-30).log(), at::zeros_like(a));
              ploss_i = -(pm * loga).sum() / den;
            } else {
              // This rank's share of mean_a; the weight w from the sample's (summed over the
              // group, outside the gradient). The group's shares sum to the sample's ploss_i.
              const at::Tensor mean_a = (pm * a).sum() / den;
              at::Tensor mean_all = mean_a.detach();
              if (sp) {
                mean_all = mean_all.clone().contiguous();
                options.seq_group->all_reduce_sum(mean_all);
              }
              const at::Tensor w = options.kl_scale * (-options.kl_decay * mean_all).exp();
              ploss_i = w * ploss_i + (1.0 - w) * (1.0 / static_cast<double>(P) - mean_a);
            }
          }
        } else {
          // Packed: each document's ploss as its own micro-batch would give it (B = 1, S its
          // length), summed over the documents (StepOutput::units).
          const at::Tensor doc = rows.doc.index_select(0, take);
          const int64_t D = rows.doc_length.numel();
          const auto per_doc = [&](const at::Tensor& x) {
            return at::zeros({D}, x.options()).index_add(0, doc, x);
          };
          const at::Tensor pm_doc = per_doc(pm);
          at::Tensor ploss_doc =
              per_doc(pm * vals) / (options.normalization == LossNormalization::kBatchTokens
                                        ? rows.doc_length.to(acc)
                                        : pm_doc.clamp_min(1.0));
          if (options.lk != LossOptions::LK::kNone) {
            const at::Tensor den = pm_doc.clamp_min(1e-8);
            if (options.lk == LossOptions::LK::kAlpha) {
              const at::Tensor loga = at::where(a > 0, a.clamp_min(1e-30).log(), at::zeros_like(a));
              ploss_doc = -per_doc(pm * loga) / den;
            } else {
              const at::Tensor mean_a = per_doc(pm * a) / den;
              const at::Tensor w = options.kl_scale * (-options.kl_decay * mean_a.detach()).exp();
              ploss_doc = w * ploss_doc + (1.0 - w) * (1.0 - mean_a);
            }
          }
          ploss_i = ploss_doc.sum();
        }
        const double w = std::pow(options.step_decay, static_cast<double>(i));
        total = total.defined() ? total + w * ploss_i : w * ploss_i;
        if (i == 0) {
          // The engine's first draft of each reply, at the row before it (LossRows::pre): its
          // step-0 logits, in a call of its own so the loss rows' logits keep their bits. Made
          // on every micro-batch, rows or not, so the sharding engine sees the same unit order.
          const at::Tensor pre = out.reshape({-1, out.size(-1)}).index_select(0, rows.pre).detach();
          at::Tensor pre_best;
          if (chunk > 0) {
            std::vector<at::Tensor> parts;
            Eagle3DraftImpl::HeadFns fns;
            fns.inspect = [&](const at::Tensor& z, int64_t) { parts.push_back(z.argmax(-1)); };
            model.head_rows(pre, chunk, fns);
            pre_best = at::cat(parts);
          } else {
            at::Tensor pre_logits = model.logits(pre);
            at::NoGradGuard guard;
            pre_best = pre_logits.argmax(-1);
          }
          at::NoGradGuard guard;
          pre_hit = d2t_hits(pre_best, d2t, target.pre_ids).to(at::kFloat);
        }
        at::NoGradGuard guard;
        // The cast to fp32 is exact, so the logits' own argmax is the fp32 one.
        if (!best.defined()) best = logits.argmax(-1);
        at::Tensor hit =
            d2t_hits(best, d2t, target.target_ids.index_select(0, take)).to(at::kFloat);
        ploss.push_back(ploss_i.detach().to(at::kFloat));
        correct.push_back(hit.sum());
        if (rows.packed()) {
          const at::Tensor doc = rows.doc.index_select(0, take);
          const at::Tensor doc_hits =
              at::zeros({rows.doc_length.numel()}, hit.options()).index_add(0, doc, hit);
          batch_acc.push_back((doc_hits / rows.doc_count[i].clamp_min(1e-6)).sum());
        }
        hits.push_back(at::zeros({N}, hit.options()).index_copy_(0, take, hit));
        const at::Tensor accept =
            (accept_rows.defined() ? sum_acceptance(accept_rows.size(1), Vd, pm,
                                                    [&](int64_t from, int64_t len) {
                                                      return accept_rows.narrow(1, from, len);
                                                    })
                                   : expected_acceptance(logits.detach(), target.target_p,
                                                         target.draft_mass, take, pm, acc))
                .to(at::kFloat);
        accept_rate.push_back(accept[0]);
        accept_renorm.push_back(accept[1]);
        loss_tokens.push_back(
            at::scalar_tensor(static_cast<double>(rows.count[static_cast<size_t>(i)]),
                              at::TensorOptions().dtype(at::kFloat).device(hidden.device())));
        position_tokens.push_back(pm_sum.to(at::kFloat));
      });
  // Sequence-parallel: the trainer's gradient average over all ranks counts each sample P times;
  // the group's shares sum to the sample's loss, so each is scaled by P.
  res.loss = total * static_cast<double>(P) / static_cast<double>(options.accumulation_steps);
  res.objective = total.detach();
  res.ploss = at::stack(ploss);
  res.correct = at::stack(correct);
  res.loss_tokens = at::stack(loss_tokens);
  res.position_tokens = at::stack(position_tokens);
  res.accept_rate = at::stack(accept_rate);
  res.accept_rate_renorm = at::stack(accept_renorm);
  res.acc = res.correct / res.loss_tokens.clamp_min(1e-6);
  if (rows.packed()) {
    res.units = static_cast<int64_t>(rows.documents.size());
    res.batch_acc = at::stack(batch_acc);
  }
  res.valid_tokens =
      (sp ? attention_mask.narrow(1, 0, rows.shard_local) : attention_mask).to(at::kLong).sum();
  if (sp) {
    // One sample per group: rank 0 counts it, and its per-sample acc from the group's sums.
    at::Tensor sums = at::cat({res.correct, res.loss_tokens}).to(at::kDouble).contiguous();
    options.seq_group->all_reduce_sum(sums);
    const bool first = options.seq_group->rank() == 0;
    res.units = first ? 1 : 0;
    res.batch_acc =
        first ? (sums.narrow(0, 0, T) / sums.narrow(0, T, T).clamp_min(1e-6)).to(at::kFloat)
              : at::zeros({T}, res.acc.options());
  }
  {
    // Chains (StepOutput::accepted): step i of the chain anchored at loss row j is step i's hit
    // at row j + i, counted while the rows stay consecutive positions of one sample.
    at::NoGradGuard guard;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(rows.rows.device());
    // Chains that can reach length T (sequence-parallel: anchored at this rank's positions).
    at::Tensor full = rows.run.ge(T).to(at::kFloat);
    if (sp) full = full * rows.local_anchor;
    at::Tensor alive = at::ones({N}, f32);
    std::vector<at::Tensor> chain_hits;
    for (int64_t i = 0; i < T; ++i) {
      if (N == 0) {
        chain_hits.push_back(at::zeros({}, f32));
        continue;
      }
      at::Tensor at_i =
          i == 0
              ? hits[0]
              : at::cat({hits[static_cast<size_t>(i)].narrow(0, std::min(i, N), N - std::min(i, N)),
                         at::zeros({std::min(i, N)}, f32)});
      alive.mul_(at_i).mul_(rows.run.gt(i));
      chain_hits.push_back((alive * full).sum());
    }
    res.chain_hits = at::stack(chain_hits);
    res.accepted = res.chain_hits.sum();
    res.anchors = full.sum();
    std::tie(res.draft_accepted, res.drafts) =
        engine_chains(rows, hits, pre_hit, T, sp ? options.seq_group : nullptr);
  }
  return res;
}

}  // namespace

at::Tensor shift_left(const at::Tensor& x, int64_t n) {
  if (n == 0) return x;
  const int64_t S = x.size(1);
  if (n >= S) return at::zeros_like(x);
  auto pad_sizes = x.sizes().vec();
  pad_sizes[1] = n;
  return at::cat({x.narrow(1, n, S - n), at::zeros(pad_sizes, x.options())}, 1);
}

std::vector<at::Tensor> ttt_logits(Eagle3DraftImpl& model, const at::Tensor& input_ids,
                                   const at::Tensor& attention_mask, const at::Tensor& aux_hidden,
                                   int64_t ttt_length, AttentionImpl impl) {
  check_batch(model, input_ids, attention_mask, attention_mask, aux_hidden, ttt_length);
  std::vector<at::Tensor> out;
  unroll(model, input_ids, SeqLayout(attention_mask), aux_hidden, ttt_length, impl,
         [&](int64_t, const at::Tensor& h) { out.push_back(model.logits(h)); });
  return out;
}

LossRows LossRows::build(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                         const std::vector<int64_t>& documents) {
  return build_rows(loss_mask, ttt_length, device, documents, nullptr);
}

LossRows LossRows::build_shard(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                               int64_t offset, int64_t local) {
  FSDP_CHECK(loss_mask.dim() == 2 && loss_mask.size(0) == 1 && offset >= 0 && local >= 1,
             fsdp::str("sequence-parallel loss rows need one sample's [1, S] loss mask and a "
                       "slice; got ",
                       loss_mask.sizes(), ", offset ", offset, ", ", local, " positions"),
             "sequence parallelism runs micro-batch 1");
  const ShardSpan span{offset, local};
  return build_rows(loss_mask, ttt_length, device, {}, &span);
}

namespace {
LossRows build_rows(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                    const std::vector<int64_t>& documents, const ShardSpan* shard) {
  FSDP_CHECK(loss_mask.dim() == 2, fsdp::str("loss_mask must be [B, S], got ", loss_mask.sizes()),
             "collate samples into a [B, S] batch");
  FSDP_CHECK(ttt_length >= 1, fsdp::str("ttt_length must be >= 1, got ", ttt_length),
             "use --ttt-length 7 (default)");
  LossRows r;
  r.batch = loss_mask.size(0);
  r.seq = loss_mask.size(1);
  r.ttt_length = ttt_length;
  r.documents = documents;
  check_layout(SeqLayout(at::Tensor(), documents), r.batch, r.seq);
  // Each flat row's position inside its sample (unpacked: its row; packed: its document) and
  // the document it belongs to.
  const auto D = static_cast<int64_t>(documents.size());
  std::vector<int64_t> doc_start, doc_of;
  if (r.packed()) {
    int64_t s0 = 0;
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t j = 0; j < documents[static_cast<size_t>(d)]; ++j) {
        doc_start.push_back(s0);
        doc_of.push_back(d);
      }
      s0 += documents[static_cast<size_t>(d)];
    }
  }
  const int64_t sample_seq = r.seq;  // r.seq becomes the window's length when sharded
  const auto pos = [&](int64_t k) {
    return r.packed() ? k - doc_start[static_cast<size_t>(k)] : k % sample_seq;
  };
  at::Tensor m = loss_mask.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* mp = m.data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < m.numel(); ++k) {
    if (mp[k] != 0) rows.push_back(k);
  }
  // Consecutive loss positions of one sample, from each row on, capped at T.
  std::vector<int64_t> run(rows.size(), 1);
  for (size_t j = rows.size(); j-- > 1;) {
    if (rows[j] == rows[j - 1] + 1 && pos(rows[j]) != 0)
      run[j - 1] = std::min(run[j] + 1, ttt_length);
  }
  // The engine's drafts (see the header): per reply a..e (loss rows j0..j1 of one sample), the
  // nodes p = first..e-2 with first = a-1 (a pre row) or a at a sample's start; node p's step i
  // is scored at row p+i while p+i <= e-2.
  const auto N = static_cast<int64_t>(rows.size());
  std::vector<int64_t> pre, node_end, node_start, node_pos;
  std::vector<std::vector<int64_t>> node_hit(static_cast<size_t>(ttt_length));
  for (size_t j0 = 0; j0 < rows.size();) {
    size_t j1 = j0;
    while (j1 + 1 < rows.size() && rows[j1 + 1] == rows[j1] + 1 && pos(rows[j1 + 1]) != 0) ++j1;
    const int64_t a = pos(rows[j0]), e = pos(rows[j1]), first = a >= 1 ? a - 1 : a;
    if (e - 2 >= first) {
      const auto pre_index = static_cast<int64_t>(pre.size());
      if (a >= 1) pre.push_back(rows[j0] - 1);
      const auto k0 = static_cast<int64_t>(node_end.size()), k1 = k0 + (e - 2 - first + 1);
      node_start.push_back(k0);
      for (int64_t p = first; p <= e - 2; ++p) {
        node_end.push_back(k1);
        node_pos.push_back(rows[j0] - a + p);
        for (int64_t i = 0; i < ttt_length; ++i) {
          int64_t slot = -1;  // the trailing 0, set below once R is known
          if (p + i <= e - 2) {
            slot = p + i < a ? N + pre_index : static_cast<int64_t>(j0) + (p + i - a);
          }
          node_hit[static_cast<size_t>(i)].push_back(slot);
        }
      }
    }
    j0 = j1 + 1;
  }
  const auto R = static_cast<int64_t>(pre.size());
  for (auto& list : node_hit)
    for (int64_t& slot : list)
      if (slot < 0) slot = N + R;
  r.engine_nodes = static_cast<int64_t>(node_end.size());
  // This rank's part (everything, unsharded): loss rows [j_lo, j_hi) with positions in the
  // window, pre rows [q_lo, q_hi) and nodes [k_lo, k_hi) at its draft positions.
  int64_t lo = 0, hi_draft = m.numel();
  size_t j_lo = 0, j_hi = rows.size(), q_lo = 0, q_hi = pre.size(), k_lo = 0,
         k_hi = node_pos.size();
  if (shard) {
    lo = shard->offset;
    hi_draft = lo + shard->local;
    const int64_t hi = hi_draft + ttt_length - 1;
    r.shard_offset = lo;
    r.shard_local = shard->local;
    r.shard_total = r.seq;
    r.seq = hi - lo;
    const auto first_at = [](const std::vector<int64_t>& v, int64_t x) {
      return static_cast<size_t>(std::lower_bound(v.begin(), v.end(), x) - v.begin());
    };
    j_lo = first_at(rows, lo);
    j_hi = first_at(rows, hi);
    q_lo = first_at(pre, lo);
    q_hi = first_at(pre, hi_draft);
    k_lo = first_at(node_pos, lo);
    k_hi = first_at(node_pos, hi_draft);
  }
  const auto n_loc = static_cast<int64_t>(j_hi - j_lo), r_loc = static_cast<int64_t>(q_hi - q_lo);
  std::vector<int64_t> local_rows, local_run, local_pre, anchor;
  for (size_t j = j_lo; j < j_hi; ++j) {
    local_rows.push_back(rows[j] - lo);
    local_run.push_back(run[j]);
    anchor.push_back(rows[j] < hi_draft ? 1 : 0);
  }
  for (size_t q = q_lo; q < q_hi; ++q) local_pre.push_back(pre[q] - lo);
  // The nodes' hit slots in this rank's cat(hit_i [n_loc], pre hit_i [r_loc], 0).
  std::vector<std::vector<int64_t>> local_hit(static_cast<size_t>(ttt_length));
  for (int64_t i = 0; i < ttt_length; ++i) {
    for (size_t k = k_lo; k < k_hi; ++k) {
      const int64_t slot = node_hit[static_cast<size_t>(i)][k];
      int64_t mapped = n_loc + r_loc;
      if (slot < N) {
        mapped = slot - static_cast<int64_t>(j_lo);
      } else if (slot < N + R) {
        mapped = n_loc + (slot - N - static_cast<int64_t>(q_lo));
      }
      FSDP_CHECK(mapped >= 0 && mapped <= n_loc + r_loc,
                 fsdp::str("loss rows: node at ", node_pos[k], " reads outside the window"),
                 "this is a bug in fsdp-train: please report it with the command line and log");
      local_hit[static_cast<size_t>(i)].push_back(mapped);
    }
  }
  r.engine_first = static_cast<int64_t>(k_lo);
  r.engine_local = static_cast<int64_t>(k_hi - k_lo);
  // All index lists go in one host buffer (pinned for a GPU) and one asynchronous copy; the
  // lists are views of the device copy. No per-list blocking copies, no stream sync.
  std::vector<int64_t> all(local_rows);
  all.insert(all.end(), local_run.begin(), local_run.end());
  const size_t engine_at = all.size();
  for (const auto* list : {&local_pre, &node_end, &node_start})
    all.insert(all.end(), list->begin(), list->end());
  for (const auto& list : local_hit) all.insert(all.end(), list.begin(), list.end());
  std::vector<std::pair<size_t, size_t>> target_span, draft_span;  // (offset, length)
  std::vector<int64_t> doc_count(static_cast<size_t>(ttt_length * D), 0);
  // Step i's rows: loss rows at position t >= i (in the sample or document) whose draft row
  // t - i is this rank's.
  const auto scored = [&](size_t j, int64_t i) {
    const int64_t k = rows[j];
    return pos(k) >= i && k - i >= lo && k - i < hi_draft;
  };
  for (int64_t i = 0; i < ttt_length; ++i) {
    const size_t t0 = all.size();
    for (size_t j = j_lo; j < j_hi; ++j) {
      if (scored(j, i)) {
        all.push_back(static_cast<int64_t>(j - j_lo));
        if (r.packed())
          ++doc_count[static_cast<size_t>(i * D + doc_of[static_cast<size_t>(rows[j])])];
      }
    }
    const size_t n = all.size() - t0;
    const size_t d0 = all.size();
    for (size_t j = j_lo; j < j_hi; ++j) {
      if (scored(j, i)) all.push_back(rows[j] - i - lo);
    }
    target_span.emplace_back(t0, n);
    draft_span.emplace_back(d0, n);
    r.count.push_back(static_cast<int64_t>(n));
  }
  const size_t anchor_at = all.size();
  if (shard) all.insert(all.end(), anchor.begin(), anchor.end());
  const size_t doc_at = all.size();
  if (r.packed()) {
    for (const int64_t k : rows) all.push_back(doc_of[static_cast<size_t>(k)]);
    all.insert(all.end(), documents.begin(), documents.end());
    all.insert(all.end(), doc_count.begin(), doc_count.end());
  }
  at::Tensor host = at::empty({static_cast<int64_t>(all.size())},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  std::copy(all.begin(), all.end(), host.data_ptr<int64_t>());
  at::Tensor dev = host.to(device, /*non_blocking=*/true);
  const auto view = [&](size_t offset, size_t length) {
    return dev.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(length));
  };
  r.rows = view(0, local_rows.size());
  r.run = view(local_rows.size(), local_rows.size());
  size_t offset = engine_at;
  for (auto [field, length] : {std::pair<at::Tensor*, size_t>{&r.pre, local_pre.size()},
                               {&r.engine_end, node_end.size()},
                               {&r.engine_start, node_start.size()}}) {
    *field = view(offset, length);
    offset += length;
  }
  for (const auto& list : local_hit) {
    r.engine_hit.push_back(view(offset, list.size()));
    offset += list.size();
  }
  for (int64_t i = 0; i < ttt_length; ++i) {
    r.target.push_back(view(target_span[i].first, target_span[i].second));
    r.draft.push_back(view(draft_span[i].first, draft_span[i].second));
  }
  if (shard) r.local_anchor = view(anchor_at, anchor.size()).to(at::kFloat);
  if (r.packed()) {
    const auto d = static_cast<size_t>(D);
    r.doc = view(doc_at, rows.size());
    r.doc_length = view(doc_at + rows.size(), d).to(at::kFloat);
    r.doc_count = view(doc_at + rows.size() + d, d * static_cast<size_t>(ttt_length))
                      .to(at::kFloat)
                      .view({ttt_length, D});
  }
  return r;
}
}  // namespace

StepOutput ttt_step(Eagle3DraftImpl& model, const TargetDistribution& target,
                    const at::Tensor& input_ids, const at::Tensor& attention_mask,
                    const at::Tensor& loss_mask, const at::Tensor& aux_hidden,
                    const LossOptions& options, const std::vector<int64_t>& documents) {
  const int64_t T = options.ttt_length;
  check_batch(model, input_ids, attention_mask, loss_mask, aux_hidden, T);
  const int64_t B = input_ids.size(0), S = input_ids.size(1), Vd = model.config().draft_vocab();
  FSDP_CHECK(target.target_p.dim() == 3 && target.target_p.size(0) == B &&
                 target.target_p.size(1) == S + T && target.target_p.size(2) == Vd,
             fsdp::str("target_p must be [", B, ", ", S + T, ", ", Vd,
                       "] (S + ttt_length rows), got ", target.target_p.sizes()),
             "compute the target with the same ttt_length and draft vocabulary");
  FSDP_CHECK(
      target.position_mask.sizes() == input_ids.sizes(),
      fsdp::str("position_mask must be [", B, ", ", S, "], got ", target.position_mask.sizes()),
      "compute the target from this batch");
  LossRows rows = LossRows::build(loss_mask, T, input_ids.device(), documents);
  RowsTarget t;
  {
    at::NoGradGuard guard;
    t.target_p = target.target_p.narrow(1, 0, S).reshape({B * S, Vd}).index_select(0, rows.rows);
    t.position = target.position_mask.reshape({B * S}).index_select(0, rows.rows);
    if (target.draft_mass.defined())
      t.draft_mass = target.draft_mass.reshape({B * S}).index_select(0, rows.rows);
    at::Tensor ids = target.target_ids;
    if (!ids.defined()) {
      // The target id of argmax p where the position mask is set; none (-1) elsewhere.
      at::Tensor best = target.target_p.narrow(1, 0, S).argmax(-1);
      ids = at::where(
          target.position_mask.ne(0),
          best + model.d2t.to(at::kLong).index_select(0, best.reshape({-1})).view_as(best),
          at::full({}, -1, best.options()));
    }
    FSDP_CHECK(ids.sizes() == input_ids.sizes(),
               fsdp::str("target_ids must be [", B, ", ", S, "], got ", ids.sizes()),
               "compute the target from this batch");
    const at::Tensor flat = ids.reshape({B * S}).to(at::kLong);
    t.target_ids = flat.index_select(0, rows.rows);
    t.pre_ids = flat.index_select(0, rows.pre);
  }
  return step_on_rows(model, t, rows, input_ids, attention_mask, aux_hidden, options);
}

StepOutput ttt_step(Eagle3DraftImpl& model, const TargetHead& head, const LossRows& rows,
                    const at::Tensor& input_ids, const at::Tensor& attention_mask,
                    const at::Tensor& loss_mask, const at::Tensor& aux_hidden,
                    const at::Tensor& target_hidden, const LossOptions& options) {
  check_batch(model, input_ids, attention_mask, loss_mask, aux_hidden, options.ttt_length);
  FSDP_CHECK(head.draft_vocab_size() == model.config().draft_vocab() &&
                 head.vocab_size() == model.config().vocab_size,
             fsdp::str("target head has V=", head.vocab_size(), ", Vd=", head.draft_vocab_size(),
                       "; draft config ", model.config().source,
                       " has V=", model.config().vocab_size, ", Vd=", model.config().draft_vocab()),
             "build the target head with the same vocab mapping (t2d) as the draft model");
  FSDP_CHECK(target_hidden.dim() == 3 && target_hidden.size(0) == input_ids.size(0) &&
                 target_hidden.size(1) == input_ids.size(1),
             fsdp::str("target_hidden must be [B, S, H] matching input_ids ", input_ids.sizes(),
                       ", got ", target_hidden.sizes()),
             "every batch tensor is padded to the same [B, S]");
  // The draft vocabulary's mass: LK's objectives and SpecForge's acceptance_rate_i.
  RowTarget rt = head.compute_rows(target_hidden, rows.rows, options.target, options.vocab_tile,
                                   /*want_mass=*/true);
  at::Tensor pre_ids = at::empty({0}, rt.target_ids.options());
  if (rows.pre.numel() > 0) {
    pre_ids =
        head.compute_rows(target_hidden, rows.pre, options.target, options.vocab_tile).target_ids;
  }
  RowsTarget t{rt.target_p, rt.target_ids, rt.in_draft, pre_ids, rt.draft_mass};
  return step_on_rows(model, t, rows, input_ids, attention_mask, aux_hidden, options);
}

StepOutput ttt_step(Eagle3DraftImpl& model, const TargetHead& head, const at::Tensor& input_ids,
                    const at::Tensor& attention_mask, const at::Tensor& loss_mask,
                    const at::Tensor& aux_hidden, const at::Tensor& target_hidden,
                    const LossOptions& options) {
  FSDP_CHECK(loss_mask.dim() == 2, fsdp::str("loss_mask must be [B, S], got ", loss_mask.sizes()),
             "collate samples into a [B, S] batch");
  LossRows rows = LossRows::build(loss_mask, options.ttt_length, input_ids.device());
  return ttt_step(model, head, rows, input_ids, attention_mask, loss_mask, aux_hidden,
                  target_hidden, options);
}

}  // namespace fsdp::model
