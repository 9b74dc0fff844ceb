// CommSeqGroup (seq_group.h).
#include "train/seq_group.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace fsdp::train {

void CommSeqGroup::all_to_all(const at::Tensor& in, const at::Tensor& out) {
  comm_->all_to_all(in, out)->wait();
}

void CommSeqGroup::all_reduce_sum(const at::Tensor& t) {
  // The communicators reduce contiguous tensors in place.
  if (t.is_contiguous()) {
    comm_->all_reduce(t, comm::ReduceOp::kSum)->wait();
    return;
  }
  at::Tensor c = t.contiguous();
  comm_->all_reduce(c, comm::ReduceOp::kSum)->wait();
  t.copy_(c);
}

data::Batch share_batch(comm::Communicator& group, data::Batch batch, int64_t halo,
                        bool pin_memory) {
  if (!batch.awaits_share) return batch;
  FSDP_CHECK(group.device_type() == c10::kCPU,
             "share_batch needs a host communicator, got " + group.backend(),
             "this is a bug in fsdp-train: please report it with the command line and log");
  const bool root = group.rank() == 0;
  // Shape of the sample rank 0 read: [1, S] ids/masks, [1, S, W] aux, [1, S, H] target.
  at::Tensor head = at::zeros({4}, at::kLong);
  if (root) {
    FSDP_CHECK(batch.batch_size() == 1 && batch.documents.empty(),
               fsdp::str("share_batch: rank 0 holds a [", batch.batch_size(), ", ", batch.seq_len(),
                         "] batch, not one unpacked sample"),
               "sequence parallelism runs --draft-micro-batch-size 1 without --packing");
    auto* h = head.data_ptr<int64_t>();
    h[0] = batch.seq_len();
    h[1] = batch.target_hidden.size(2);
    h[2] = batch.aux_hidden.size(2);
    h[3] = batch.num_skipped;
  }
  group.broadcast(head, 0)->wait();
  const auto* h = head.data_ptr<int64_t>();
  const int64_t S = h[0], H = h[1], W = h[2];
  if (!root) {
    const auto ids = at::TensorOptions().dtype(at::kLong);
    const auto hidden = at::TensorOptions().dtype(at::kBFloat16);
    batch.input_ids = at::empty({1, S}, ids);
    batch.loss_mask = at::empty({1, S}, ids);
    batch.attention_mask = at::empty({1, S}, ids);
    batch.aux_hidden = at::empty({1, S, W}, hidden);
    batch.target_hidden = at::empty({1, S, H}, hidden);
    batch.num_skipped = h[3];
  }
  for (at::Tensor* t : {&batch.input_ids, &batch.loss_mask, &batch.attention_mask,
                        &batch.aux_hidden, &batch.target_hidden}) {
    FSDP_CHECK(t->is_contiguous() && t->device().is_cpu() &&
                   t->scalar_type() == (t->dim() == 2 ? at::kLong : at::kBFloat16),
               "share_batch: a batch tensor is not a contiguous host tensor of the collated dtype",
               "this is a bug in fsdp-train: please report it with the command line and log");
    group.broadcast(*t, 0)->wait();
  }
  data::Batch out = data::slice_batch(batch, group.rank(), group.size(), halo, pin_memory);
  out.documents = batch.documents;
  return out;
}

}  // namespace fsdp::train
