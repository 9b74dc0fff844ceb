// The objective of one TTT step over its loss rows (docs/model.md "Loss functions"): what the
// draft head's logits give per row (the loss, LK's acceptance, the argmax and the acceptance
// rows), and ploss_i from those rows, their weights and the normalisers it is handed. One path:
// the head runs over all rows at once (one chunk, its logits kept) or over row chunks
// (backward recomputes them); the per-row values are the same function either way. Internal to
// lib/model; knows nothing of ranks or batches beyond the normalisers it is given.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "model/draft_model.h"
#include "model/loss_normalizers.h"
#include "model/loss_rows.h"
#include "model/ttt_loss.h"

namespace fsdp::model {

// The target on the loss rows: target_p [N, Vd], the full-vocabulary argmax target_ids [N],
// position_mask0 at those rows, and the full-vocabulary argmax at LossRows::pre, pre_ids [R].
struct RowsTarget {
  at::Tensor target_p, target_ids, position, pre_ids;
  at::Tensor draft_mass;  // fp32 [N] or undefined (1)
};

// fp32, or fp64 for double logits: the precision the objective and the metrics run in.
at::ScalarType objective_dtype(const at::Tensor& logits);

// What one step's head pass over rows `take` of the target gives.
struct ScoredRows {
  at::Tensor loss;     // [n] differentiable: the objective per row (undefined for LK alpha)
  at::Tensor overlap;  // [n] differentiable, LK only: sum_v min(p_on_draft, q)
  at::Tensor best;     // int64 [n]: the draft's argmax (detached)
  at::Tensor accept;   // [2, n] detached: acceptance_rows (ttt_acceptance.h)
};

// The draft head over `hidden` [n, H] (the step's draft rows), scored against target rows
// `take`. chunk 0: model.logits over all rows, the logits kept by the graph (recompute_loss and
// the fused kernel apply); chunk > 0: Eagle3DraftImpl::head_rows over chunks of that many rows.
ScoredRows score_rows(Eagle3DraftImpl& model, const at::Tensor& hidden, const RowsTarget& target,
                      const at::Tensor& take, const LossOptions& options, int64_t chunk);

// The draft's argmax of rows `hidden` (no loss; the engine's pre rows), chunked as score_rows.
at::Tensor head_argmax(Eagle3DraftImpl& model, const at::Tensor& hidden, int64_t chunk);

// ploss_i: sum_rows weight * value within each unit (the micro-batch, or each packed document:
// units.doc), divided by the unit's normaliser, summed over the units; with LK, SpecForge's
// alpha or lambda objective in its place. weight: fp32 [n], the position mask of the rows.
at::Tensor step_ploss(const ScoredRows& rows, const at::Tensor& weight, const LossUnits& units,
                      const StepNormalizer& norm, const LossNormalizers& all,
                      const LossOptions& options);

}  // namespace fsdp::model
