// The TTT step (docs/reference.md §3.2, §5): the unroll, and the step that combines the loss's
// parts: which rows are scored (loss_rows.h), the objective over them (loss_objective.h), its
// normalisers (loss_normalizers.h) and the metrics (ttt_acceptance.h). Metrics stay on the
// device as tensors: nothing here synchronises with the host unless LossOptions::check_padding
// asks for it.
#include "model/ttt_loss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/loss_normalizers.h"
#include "model/loss_objective.h"
#include "model/memory_estimate.h"
#include "model/seq_parallel.h"
#include "model/ttt_acceptance.h"

namespace fsdp::model {
namespace {

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

// What the attention sees of the micro-batch: its layout, and for a sequence-parallel shard the
// slice this rank holds of the sample (seq_parallel.h).
SeqLayout step_layout(const LossRows& rows, const at::Tensor& input_ids,
                      const at::Tensor& attention_mask, const LossOptions& options) {
  if (!rows.sharded()) return SeqLayout(attention_mask, rows.documents);
  FSDP_CHECK(options.seq_group != nullptr && rows.batch == 1,
             fsdp::str("sequence-parallel loss rows for a [", rows.batch, ", ", rows.seq,
                       "] batch without ",
                       options.seq_group ? "micro-batch 1" : "a sequence-parallel group"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  auto shard = std::make_shared<SeqShard>();
  shard->group = options.seq_group;
  shard->offset = rows.shard_offset;
  shard->local = rows.shard_local;
  shard->total = rows.shard_total;
  shard->full_mask = at::arange(shard->padded(), input_ids.options())
                         .lt(rows.shard_total)
                         .to(at::kLong)
                         .unsqueeze(0);
  SeqLayout layout(attention_mask.narrow(1, 0, rows.shard_local));
  layout.shard = shard;
  return layout;
}

// Each step's row weights: the position mask at its rows (fp32 [N_i]).
std::vector<at::Tensor> row_weights(const RowsTarget& target, const LossRows& rows, int64_t T) {
  at::NoGradGuard guard;
  std::vector<at::Tensor> w;
  for (int64_t i = 0; i < T; ++i)
    w.push_back(
        target.position.index_select(0, rows.target[static_cast<size_t>(i)]).to(at::kFloat));
  return w;
}

// The step that combines the parts: the unroll, each step's head pass scored against the target
// (loss_objective.h), ploss_i over the normalisers computed first (loss_normalizers.h), the
// decayed sum, and the metrics (ttt_acceptance.h).
StepOutput step_on_rows(Eagle3DraftImpl& model, const RowsTarget& target, const LossRows& rows,
                        const at::Tensor& input_ids, const at::Tensor& attention_mask,
                        const at::Tensor& aux_hidden, const LossOptions& options) {
  const int64_t T = options.ttt_length;
  FSDP_CHECK(
      rows.ttt_length >= T && rows.batch == input_ids.size(0) && rows.seq == input_ids.size(1),
      fsdp::str("loss rows were built for [", rows.batch, ", ", rows.seq, "] and ", rows.ttt_length,
                " steps; the batch is ", input_ids.sizes(), " with ", T, " steps"),
      "build LossRows from this batch's loss_mask and the same ttt_length");
  if (options.check_padding) check_right_padded(attention_mask);
  const SeqLayout layout = step_layout(rows, input_ids, attention_mask, options);
  const std::vector<at::Tensor> weights = row_weights(target, rows, T);
  const LossNormalizers norm = loss_normalizers(rows, weights, options);
  // Chunked or not, for the whole micro-batch (steps after 0 have at most N rows).
  const int64_t chunk =
      head_chunk_rows(options.head_chunk_rows, rows.rows.numel(), model.config().draft_vocab());
  AcceptanceMeter meter(rows, target, model.d2t.to(at::kLong), norm.group);
  at::Tensor total;
  std::vector<at::Tensor> ploss;
  unroll(model, input_ids, layout, aux_hidden, T, options.attention,
         [&](int64_t i, const at::Tensor& out) {
           const auto s = static_cast<size_t>(i);
           const at::Tensor flat = out.reshape({-1, out.size(-1)});
           const ScoredRows scored = score_rows(model, flat.index_select(0, rows.draft[s]), target,
                                                rows.target[s], options, chunk);
           const at::Tensor ploss_i = step_ploss(scored, weights[s], LossUnits::of_step(rows, i),
                                                 norm.steps[s], norm, options);
           const double w = std::pow(options.step_decay, static_cast<double>(i));
           total = total.defined() ? total + w * ploss_i : w * ploss_i;
           // The engine's first draft of each reply, at the row before it (LossRows::pre): its
           // step-0 logits, in a call of its own so the loss rows' logits keep their bits. Made
           // on every micro-batch, rows or not, so the sharding engine sees the same unit order.
           if (i == 0)
             meter.add_pre(head_argmax(model, flat.index_select(0, rows.pre).detach(), chunk));
           meter.add_step(i, scored, weights[s]);
           ploss.push_back(ploss_i.detach().to(at::kFloat));
         });
  StepOutput res;
  res.batch = rows.batch;
  res.seq = rows.sharded() ? rows.shard_total : rows.seq;
  res.loss = norm.backward_loss(total);
  res.objective = total.detach();
  res.ploss = at::stack(ploss);
  meter.write(res);
  res.valid_tokens =
      (rows.sharded() ? attention_mask.narrow(1, 0, rows.shard_local) : attention_mask)
          .to(at::kLong)
          .sum();
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
