// The normalisers of the TTT loss (docs/model.md "Loss functions", docs/reference.md §5),
// computed before the objective and handed to it, so the objective itself only sums (as
// torchtitan's loss sums and its trainer passes the token count):
// - per step and unit (the micro-batch, or each packed document): ploss_i's denominator, B*S
//   (--loss-normalization batch; a packed document's length) or the position rows (tokens,
//   at least 1), and LK's mean over the position rows;
// - sequence-parallel: the sample's counts, summed over the group before the unroll, and the
//   group itself (LK lambda's weight is the sample's);
// - the trainer's: the micro-batches of the optimizer step (LossOptions::accumulation_steps)
//   and the group size P by which each rank's share is scaled for the data-parallel average.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/loss_rows.h"
#include "model/seq_parallel.h"
#include "model/ttt_loss.h"

namespace fsdp::model {

// How one step's rows are summed into units: the whole micro-batch, or (packed) each document.
struct LossUnits {
  at::Tensor doc;  // int64 [n]: each row's document; undefined unpacked
  int64_t documents = 0;
  // Step i's units of `rows` (its rows LossRows::target[i]).
  static LossUnits of_step(const LossRows& rows, int64_t i);
  // [] unpacked, [D] packed: the sum of x [n] within each unit.
  at::Tensor sum(const at::Tensor& x) const;
  // The units' values added up ([] unchanged unpacked).
  at::Tensor total(const at::Tensor& x) const;
};

// One step's normalisers, per unit, as counts (exact integers in fp32 or fp64), applied in the
// precision of the sums they divide.
struct StepNormalizer {
  double tokens = -1;    // >= 0: ploss_i's denominator is this host number (B * S, unpacked)
  at::Tensor lengths;    // packed --loss-normalization batch: each document's length [D]
  at::Tensor positions;  // the position rows of each unit ([] or [D]; sequence-parallel: the
                         // sample's, where tokens or LK read them)
  // ploss_i's sum / its denominator (B * S, the lengths, or the position rows, at least 1).
  at::Tensor divide(const at::Tensor& sum) const;
  // LK's mean over the position rows: its denominator (at least 1e-8) in precision `dtype`.
  at::Tensor lk_denominator(at::ScalarType dtype) const;
};

struct LossNormalizers {
  std::vector<StepNormalizer> steps;  // one per TTT step
  SeqGroup* group = nullptr;          // sequence-parallel: the group sharing the sample
  int64_t group_size = 1;             // P
  int64_t accumulation = 1;           // micro-batches per optimizer step
  // What backward runs: the objective * P / accumulation.
  at::Tensor backward_loss(const at::Tensor& objective) const;
};

// weights[i]: fp32 [N_i], the position mask of step i's rows (RowsTarget::position at
// LossRows::target[i]). Sequence-parallel with --loss-normalization tokens or LK: one
// all-reduce over the group.
LossNormalizers loss_normalizers(const LossRows& rows, const std::vector<at::Tensor>& weights,
                                 const LossOptions& options);

}  // namespace fsdp::model
