// P-EAGLE's engine-faithful acceptance (docs/model.md "P-EAGLE"): a serving engine with parallel
// drafting proposes K tokens in one pass at each anchor and accepts the leading run of them that
// the target would have produced; walked over every reply as the engine drafts it, from the hits
// of a teacher-forced evaluation step (PEagleStepOutput::hits). Host-side, an evaluation metric.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fsdp::model {

struct PEagleWalk {
  double accepted = 0;  // tokens accepted over all drafts
  double drafts = 0;    // drafts made
};

// loss_mask int64 [B, S] and hits int64 [B, K, S] on the host. The rows follow the EAGLE3 layout
// (docs/model.md "Which row is which token"): the row at anchor p, depth d proposes x_{p+d+2},
// scored at position p + d. A reply is a run a..e of loss positions; the engine's first draft is
// at anchor a - 1 (0 at a sample's start), a draft proposes the tokens x_{p+2} .. up to K of
// them and never past x_e, accepts the leading run of hits n, and the next draft is made at
// p + n + 1 while p + 2 <= e. A missing hit (-1) ends the run.
PEagleWalk peagle_engine_walk(const at::Tensor& loss_mask, const at::Tensor& hits);

}  // namespace fsdp::model
