// The TTT loss's normalisers (loss_normalizers.h): counts computed before the objective runs.
// The only collective here is the sequence-parallel group's sum of the position rows.
#include "model/loss_normalizers.h"

#include <ATen/ATen.h>

#include <vector>

#include "core/error.h"

namespace fsdp::model {

LossUnits LossUnits::of_step(const LossRows& rows, int64_t i) {
  LossUnits u;
  if (!rows.packed()) return u;
  u.doc = rows.doc.index_select(0, rows.target[static_cast<size_t>(i)]);
  u.documents = rows.doc_length.numel();
  return u;
}

at::Tensor LossUnits::sum(const at::Tensor& x) const {
  if (!doc.defined()) return x.sum();
  return at::zeros({documents}, x.options()).index_add(0, doc, x);
}

at::Tensor LossUnits::total(const at::Tensor& x) const {
  return doc.defined() ? x.sum() : x;
}

at::Tensor StepNormalizer::divide(const at::Tensor& sum) const {
  if (tokens >= 0) return sum / tokens;
  if (lengths.defined()) return sum / lengths.to(sum.scalar_type());
  return sum / positions.to(sum.scalar_type()).clamp_min(1.0);
}

at::Tensor StepNormalizer::lk_denominator(at::ScalarType dtype) const {
  return positions.to(dtype).clamp_min(1e-8);
}

at::Tensor LossNormalizers::backward_loss(const at::Tensor& objective) const {
  // Sequence-parallel: the trainer's gradient average over all ranks counts each sample P
  // times; the group's shares sum to the sample's loss, so each is scaled by P.
  return objective * static_cast<double>(group_size) / static_cast<double>(accumulation);
}

namespace {
// Sequence-parallel: the sample's position rows of every step, summed over the group once
// (fp64 [T]).
at::Tensor group_positions(const std::vector<at::Tensor>& weights, SeqGroup& group) {
  at::NoGradGuard guard;
  std::vector<at::Tensor> sums;
  for (const at::Tensor& w : weights) sums.push_back(w.to(at::kDouble).sum());
  at::Tensor total = at::stack(sums).contiguous();
  group.all_reduce_sum(total);
  return total;
}
}  // namespace

LossNormalizers loss_normalizers(const LossRows& rows, const std::vector<at::Tensor>& weights,
                                 const LossOptions& options) {
  FSDP_CHECK(options.accumulation_steps >= 1,
             fsdp::str("accumulation_steps must be >= 1, got ", options.accumulation_steps),
             "global batch / (dp size * micro batch) is at least 1");
  const bool per_token = options.normalization == LossNormalization::kValidTokens;
  const bool lk = options.lk != LossOptions::LK::kNone;
  LossNormalizers n;
  n.accumulation = options.accumulation_steps;
  at::Tensor sample_positions;
  if (rows.sharded()) {
    n.group = options.seq_group;
    n.group_size = options.seq_group->size();
    if (per_token || lk) sample_positions = group_positions(weights, *options.seq_group);
  }
  // The micro-batch's tokens B * S (sequence-parallel: the whole sample's length).
  const int64_t seq = rows.sharded() ? rows.shard_total : rows.seq;
  at::NoGradGuard guard;
  for (size_t i = 0; i < weights.size(); ++i) {
    StepNormalizer s;
    const LossUnits units = LossUnits::of_step(rows, static_cast<int64_t>(i));
    s.positions = sample_positions.defined() ? sample_positions[static_cast<int64_t>(i)]
                                             : units.sum(weights[i]);
    if (!per_token && rows.packed()) s.lengths = rows.doc_length;
    if (!per_token && !rows.packed()) s.tokens = static_cast<double>(rows.batch * seq);
    n.steps.push_back(s);
  }
  return n;
}

}  // namespace fsdp::model
