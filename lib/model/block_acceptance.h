// The engine's acceptance of a block draft, walked as a serving engine drafts each reply
// (docs/block-drafts.md "Metrics"): each block's accepted count (the leading run of its right
// proposals), and from those at every anchor the drafts the engine makes and what it accepts.
// The walk runs on the host: an evaluation metric, no graph.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "model/dflash_model.h"

namespace fsdp::model {

// A block's accepted count: accepted [B, N] int64 = the leading run of (pred == target & valid)
// over block positions first..bs-1, for pred, target [B, N, bs] and valid [B, N, bs] bool.
// DFlash's first proposal is at position 1 (position 0 is the anchor itself), DSpark's at 0.
at::Tensor accepted_prefix(const at::Tensor& pred, const at::Tensor& target,
                           const at::Tensor& valid, int64_t first);

struct EngineWalk {
  double accepted = 0;  // sum over the drafts of their accepted tokens
  double drafts = 0;    // drafts made
  int64_t rows_walked = 0, rows_incomplete = 0;
};

// A reply is a run a..e of positions with loss_mask set. The engine knows x_a (the target's own
// token) and drafts at anchor p = a: the block proposes x_{p+1}..x_{p+bs-1} (DFlash) or
// x_{p+1}..x_{p+bs} (DSpark), the engine accepts its n leading right proposals (accepted[b, j]
// of the block anchored at p, which counts only supervised positions, so never past e), adds
// its own token and drafts next at p + n + 1; a draft is made while p + 1 <= e. Every anchor the
// walk reaches is a candidate of the anchor sampler (p and p + 1 supervised). A row is walked
// only if every anchor the walk reaches is one of its kept blocks (sample all candidates:
// --num-anchors at least the row's candidates), else it counts as incomplete and adds nothing.
// loss_mask [B, S] (host or device), layout's anchors and keep [B, N], accepted int64 [B, N].
EngineWalk engine_walk(const at::Tensor& loss_mask, const BlockLayout& layout,
                       const at::Tensor& accepted);

}  // namespace fsdp::model
