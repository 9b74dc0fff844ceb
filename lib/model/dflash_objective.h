// DFlash's objective over a micro-batch's blocks (docs/block-drafts.md), as SpecForge
// 0.2.0's OnlineDFlashModel computes it: the target's frozen LM head over the draft's block
// outputs, cross-entropy of each block position against its label, weighted by the label weights
// (and an exponential decay over block positions), or one of the D-PACE weightings; summed over
// chunks of blocks whose logits are recomputed in backward (model/chunk_reduce.h). Returns the
// additive terms; the caller divides (the normalisers of a step are the trainer's).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "model/block_targets.h"

namespace fsdp::model {

// dflash: sum(ce * w * decay) / sum(w * decay). The D-PACE family weighs each position's
// cross-entropy by a detached function of the draft's probabilities of the block's labels
// (smooth = (1 - alpha) * p + alpha; the prefix product over the block: cumulative confidence;
// its suffix sum: dpace; suffix / prefix: continuation value), summed and divided by the batch
// size.
enum class BlockLoss { kDFlash, kDPace, kDPaceCumulativeConfidence, kDPaceContinuationValue };

struct DFlashObjectiveOptions {
  BlockLoss loss = BlockLoss::kDFlash;
  double dpace_alpha = 0.5;
  // > 0: position k of a block weighs exp(-max(k - 1, 0) / gamma) (dflash only).
  std::optional<double> decay_gamma;
  int64_t chunk_blocks = 128;  // blocks per chunk; 0: all at once
  // When set, each chunk's accepted counts (accepted_prefix from position 1, int64 [B, chunk])
  // are appended in block order: for a call without backward (evaluation; backward would run
  // the chunks again).
  std::vector<at::Tensor>* accepted_blocks = nullptr;
};

// Sums over the micro-batch's blocks (0-d fp32, or fp64 for fp64 inputs).
struct DFlashTerms {
  at::Tensor loss_num;      // requires grad while training
  at::Tensor loss_den;      // sum of the (decayed) weights; 0 for the D-PACE family
  at::Tensor correct;       // supervised positions whose argmax is the label
  at::Tensor accuracy_den;  // sum of the weights (before decay)
  // The engine's acceptance simulated on the labels: per block with a supervised position,
  // 1 + the number of leading predictions (k = 1, 2, ...) that are supervised and correct.
  at::Tensor accept_num;
  at::Tensor accept_den;  // blocks with a supervised position
};

// hidden4d [B, N, bs, H] (the draft's output), labels from dflash_labels, lm_head_weight [V, H]
// (frozen).
DFlashTerms dflash_objective(const at::Tensor& hidden4d, const BlockLabels& labels,
                             const at::Tensor& lm_head_weight,
                             const DFlashObjectiveOptions& options);

}  // namespace fsdp::model
