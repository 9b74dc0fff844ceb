// The sequence-parallel group of the draft model (model::SeqGroup) over a communicator of the
// trainer (docs/architecture.md "Sequence parallelism"): every call waits for its collective.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "data/batch.h"
#include "model/seq_parallel.h"

namespace fsdp::train {

class CommSeqGroup : public model::SeqGroup {
 public:
  explicit CommSeqGroup(std::shared_ptr<comm::Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void all_to_all(const at::Tensor& in, const at::Tensor& out) override;
  void all_reduce_sum(const at::Tensor& t) override;
  comm::Communicator& communicator() { return *comm_; }

 private:
  std::shared_ptr<comm::Communicator> comm_;
};

// Sequence parallelism over a format read whole (data::Batch::awaits_share): rank 0 of `group`
// (a host communicator over the sequence-parallel group) broadcasts the sample it read, and
// every rank returns its slice (data::slice_batch with `halo`, pinned when asked). Collective
// over the group; a batch not awaiting a share is returned as it is.
data::Batch share_batch(comm::Communicator& group, data::Batch batch, int64_t halo,
                        bool pin_memory);

}  // namespace fsdp::train
