// Sequence parallelism inside the draft model (docs/model.md "Sequence parallelism"): the
// interface the model calls to exchange tensors within a sequence-parallel group (the trainer
// implements it over a communicator; the model knows no communicator), what one rank holds of a
// sharded sample, and DeepSpeed-Ulysses' exchange of the attention's heads and positions.
//
// Ulysses: each of the P ranks of a group holds a contiguous slice of L positions of one sample
// (P * L >= S, the tail padded). Around the attention, an all-to-all turns q, k, v from
// [1, heads, L, d] (all heads, my positions) into [1, heads / P, P * L, d] (my heads, all
// positions), the unchanged single-rank TTT attention runs over the whole sequence for those
// heads, and a second all-to-all brings its output back to my positions. Nothing else of the
// draft needs another rank's positions: the projections, norms, MLP and head are per position.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace fsdp::model {

// The collectives of one sequence-parallel group. Blocking: the result is ready on return.
class SeqGroup {
 public:
  virtual ~SeqGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // in, out contiguous, same dtype and numel (a multiple of size()); block j of `in` (numel /
  // size() elements) goes to rank j, and block j of `out` comes from rank j.
  virtual void all_to_all(const at::Tensor& in, const at::Tensor& out) = 0;
  // In place: t = the sum of t over the group's ranks.
  virtual void all_reduce_sum(const at::Tensor& t) = 0;
};

// What this rank holds of a sequence-sharded sample (micro-batch 1): the draft positions
// [offset, offset + local) of a sample of `total` real tokens, offset = rank * local and
// local = ceil(total / P) (the last ranks' slices end in padding, or are all padding).
struct SeqShard {
  SeqGroup* group = nullptr;
  int64_t offset = 0, local = 0, total = 0;
  // [1, P * local] int64 on the compute device: ones for the `total` real positions. The layout
  // of the whole sequence that the attention sees after the exchange.
  at::Tensor full_mask;
  int64_t padded() const { return local * group->size(); }
};

// The slice of a sample of `total` tokens that rank `rank` of `size` holds: {offset, local}.
struct SliceSpan {
  int64_t offset = 0, local = 0;
};
SliceSpan slice_span(int64_t total, int rank, int size);

// [1, nh, L, d] (all heads, my positions) -> [1, nh / P, P * L, d] (my heads, all positions).
// Differentiable (backward: head_to_seq of the gradient). nh must be a multiple of P.
at::Tensor seq_to_head(const at::Tensor& x, const SeqShard& shard);
// The inverse: [1, nh / P, P * L, d] -> [1, nh, L, d].
at::Tensor head_to_seq(const at::Tensor& x, const SeqShard& shard);

}  // namespace fsdp::model
