// The sequence-parallel group of the draft model (model::SeqGroup) over a communicator of the
// trainer (docs/architecture.md "Sequence parallelism"): every call waits for its collective.
#pragma once

#include <memory>

#include "comm/communicator.h"
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

}  // namespace fsdp::train
