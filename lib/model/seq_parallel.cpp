// Ulysses' head/position exchange (seq_parallel.h).
#include "model/seq_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "core/error.h"

namespace fsdp::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The plain exchanges (no autograd). x contiguous or not; the result is a new tensor.
at::Tensor to_heads(const at::Tensor& x, SeqGroup& g) {
  const int64_t P = g.size(), nh = x.size(1), L = x.size(2), d = x.size(3);
  // Block j of the send buffer: head group j at my positions.
  at::Tensor in = x.reshape({P, nh / P, L, d}).contiguous();
  at::Tensor out = at::empty_like(in);
  g.all_to_all(in, out);
  // Block j of the receive buffer: my head group at rank j's positions.
  return out.permute({1, 0, 2, 3}).reshape({1, nh / P, P * L, d});
}

at::Tensor to_positions(const at::Tensor& y, SeqGroup& g) {
  const int64_t P = g.size(), hp = y.size(1), L = y.size(2) / P, d = y.size(3);
  // Block j of the send buffer: my head group at rank j's positions.
  at::Tensor in = y.reshape({hp, P, L, d}).permute({1, 0, 2, 3}).contiguous();
  at::Tensor out = at::empty_like(in);
  g.all_to_all(in, out);
  // Block j of the receive buffer: head group j at my positions.
  return out.reshape({1, P * hp, L, d});
}

SeqGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<SeqGroup*>(ctx->saved_data["group"].toInt());
}

struct SeqToHead : torch::autograd::Function<SeqToHead> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return to_heads(x, *reinterpret_cast<SeqGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {to_positions(grads[0], group_of(ctx)), at::Tensor()};
  }
};

struct HeadToSeq : torch::autograd::Function<HeadToSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, int64_t group) {
    ctx->saved_data["group"] = group;
    return to_positions(y, *reinterpret_cast<SeqGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {to_heads(grads[0], group_of(ctx)), at::Tensor()};
  }
};

void check_shard(const at::Tensor& x, const SeqShard& shard, int64_t seq, int64_t head_multiple,
                 const char* what) {
  FSDP_CHECK(shard.group != nullptr && x.dim() == 4 && x.size(0) == 1 &&
                 x.size(1) % head_multiple == 0 && x.size(2) == seq,
             fsdp::str(what, ": expected [1, heads (a multiple of ", head_multiple, "), ", seq,
                       ", d], got ", x.sizes()),
             "sequence parallelism runs micro-batch 1 with heads divisible by the group size");
}

}  // namespace

SliceSpan slice_span(int64_t total, int rank, int size) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size && total >= 0,
             fsdp::str("slice_span: rank ", rank, " of ", size, ", ", total, " tokens"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  const int64_t local = std::max<int64_t>(1, (total + size - 1) / size);
  return {rank * local, local};
}

at::Tensor seq_to_head(const at::Tensor& x, const SeqShard& shard) {
  FSDP_CHECK(shard.group != nullptr, "seq_to_head: no sequence-parallel group",
             "this is a bug in fsdp-train: please report it with the command line and log");
  check_shard(x, shard, shard.local, shard.group->size(), "seq_to_head");
  if (shard.group->size() == 1) return x;
  return SeqToHead::apply(x, reinterpret_cast<int64_t>(shard.group));
}

at::Tensor head_to_seq(const at::Tensor& x, const SeqShard& shard) {
  FSDP_CHECK(shard.group != nullptr, "head_to_seq: no sequence-parallel group",
             "this is a bug in fsdp-train: please report it with the command line and log");
  check_shard(x, shard, shard.padded(), 1, "head_to_seq");
  if (shard.group->size() == 1) return x;
  return HeadToSeq::apply(x, reinterpret_cast<int64_t>(shard.group));
}

}  // namespace fsdp::model
