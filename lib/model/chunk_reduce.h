// Additive terms of an objective summed over chunks of aligned inputs (docs/model.md "Block
// drafts"), memory-bounded: with a chunk size, no chunk's intermediates (a block draft's logits
// over the whole vocabulary) outlive the chunk. The sum equals one call over the whole inputs up
// to the order of additions (fp32: within 1e-6).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace fsdp::model {

// fn(slices, params): the terms (tensors of fixed shapes, a fixed count) of one chunk; slices
// are `sliced` narrowed to the chunk along `dim`, params are passed whole (weights the terms may
// use; their gradients are summed over chunks).
using ChunkTermsFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&,
                                                           const std::vector<at::Tensor>&)>;

// The terms summed over chunks of `chunk` along `dim` of sliced[0] (all sliced inputs the same
// length there), flattened and concatenated in order into one 1-D tensor. chunk 0 (or >= the
// length): one call with an ordinary graph. Otherwise, when grad mode is on and an input
// requires grad, forward runs each chunk with a graph, takes at once the gradient of
// loss_weights . terms (the direction of the loss the caller will differentiate, one weight per
// element of that 1-D tensor; entries past its size are 0) and keeps only that gradient;
// backward scales it by the factor the loss applied, so no chunk is computed twice (the memory
// kept is one gradient the size of sliced[0]). A backward seed in another direction recomputes
// each chunk with it, calling fn again: fn must have no side effects that a second call would
// repeat, unless the caller never differentiates in another direction. Sliced inputs other than
// the first and any undefined tensor are passed through untouched by autograd.
at::Tensor chunk_reduce(const ChunkTermsFn& fn, const std::vector<at::Tensor>& sliced,
                        const std::vector<at::Tensor>& params, int64_t chunk, int64_t dim,
                        const std::vector<double>& loss_weights);

}  // namespace fsdp::model
