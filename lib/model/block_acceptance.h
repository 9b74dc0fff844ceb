// The engine's acceptance of a block draft, walked as a serving engine drafts each reply
// (docs/block-drafts.md "Metrics"): from the blocks' accepted counts at every anchor, the drafts
// the engine makes and what it accepts. On the host: an evaluation metric, no graph.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "model/dflash_model.h"

namespace fsdp::model {

struct EngineWalk {
  double accepted = 0;  // sum over the drafts of their accepted tokens
  double drafts = 0;    // drafts made
  int64_t rows_walked = 0, rows_incomplete = 0;
};

// A reply is a run a..e of positions with loss_mask set. The engine knows x_a (the target's own
// token) and drafts at anchor p = a: the block proposes x_{p+1}..x_{p+bs-1}, the engine accepts
// its n leading right proposals (accepted[b, j] of the block anchored at p, which counts only
// supervised positions, so never past e), adds its own token and drafts next at p + n + 1; a
// draft is made while p + 1 <= e. A row is walked only if every anchor the walk reaches is one
// of its kept blocks (sample all candidates: --num-anchors at least the row's candidates), else
// it counts as incomplete and adds nothing. loss_mask [B, S] (host or device), layout's anchors
// and keep [B, N], accepted int64 [B, N].
EngineWalk engine_walk(const at::Tensor& loss_mask, const BlockLayout& layout,
                       const at::Tensor& accepted);

}  // namespace fsdp::model
