// The TTT step's metrics (docs/model.md "Acceptance length" and the metrics it lists): hits
// against the target's argmax, the expected acceptance sum_v min(p, q), the all-anchor chains
// and the engine-faithful drafts, gathered step by step into StepOutput. Detached tensors only:
// nothing here reaches the loss, and nothing synchronises with the host.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/loss_objective.h"
#include "model/loss_rows.h"
#include "model/seq_parallel.h"
#include "model/ttt_loss.h"

namespace fsdp::model {

// Rows per slice of the expected-acceptance sums: at most 16 Mi elements of [rows, Vd] at once.
int64_t accept_rate_chunk(int64_t vocab);

// sum_v min(p_nv, q_nv) per row ([2, n]), q = softmax of the logits in `acc` precision: row 0
// with p the target's own probabilities of the draft tokens, target_p[take] times draft_mass
// (SpecForge's acceptance; the mass taken as 1 when undefined), row 1 with p = target_p[take]
// (renormalised over the draft vocabulary).
at::Tensor acceptance_rows(const at::Tensor& logits, const at::Tensor& target_p,
                           const at::Tensor& draft_mass, const at::Tensor& take,
                           at::ScalarType acc);

// Hits of step i: the draft argmax mapped to a target id through d2t equals the target id.
at::Tensor d2t_hits(const at::Tensor& best, const at::Tensor& d2t, const at::Tensor& target_ids);

// The metrics of one micro-batch, one TTT step at a time, then written into a StepOutput.
class AcceptanceMeter {
 public:
  // d2t: the model's draft-to-target offsets (int64 [Vd]); group: the sequence-parallel group
  // (the rows are then a shard's) or null.
  AcceptanceMeter(const LossRows& rows, const RowsTarget& target, at::Tensor d2t, SeqGroup* group);
  // Step 0's argmax at LossRows::pre, the engine's first draft of each reply.
  void add_pre(const at::Tensor& pre_best);
  // Step i's scored rows (ScoredRows::best, ::accept) and their weights (fp32 [N_i]).
  void add_step(int64_t i, const ScoredRows& scored, const at::Tensor& weight);
  // correct, acc, loss_tokens, position_tokens, the acceptance rates, batch_acc and units, the
  // chains and the engine's drafts. Sequence-parallel: two sums over the group.
  void write(StepOutput& out) const;

 private:
  void write_chains(StepOutput& out) const;

  const LossRows& rows_;
  RowsTarget target_;
  at::Tensor d2t_;
  SeqGroup* group_;
  at::Tensor pre_hit_;
  std::vector<at::Tensor> hits_;  // step i: fp32 [N], the hit at each loss row
  std::vector<at::Tensor> correct_, loss_tokens_, position_tokens_, accept_, accept_renorm_;
  std::vector<at::Tensor> batch_acc_;  // packed: step i's sum over documents of their acc_i
};

}  // namespace fsdp::model
