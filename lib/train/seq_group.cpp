// CommSeqGroup (seq_group.h).
#include "train/seq_group.h"

#include <ATen/ATen.h>

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

}  // namespace fsdp::train
