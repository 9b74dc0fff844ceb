// The run's ranks and communicators (train/run_topology.h).
#include "train/run_topology.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "comm/runtime.h"

namespace fsdp::train {

RunTopology::RunTopology(int rank, int world, int64_t sp)
    : rank_(rank), world_(world), sp_(static_cast<int>(std::max<int64_t>(1, sp))) {
  dp_world_ = world_ % sp_ == 0 ? world_ / sp_ : world_;
  dp_rank_ = rank_ / sp_;
}

void RunTopology::connect(const c10::Device& device) {
  device_ = device;
  const c10::Device cpu(c10::kCPU);
  control_ = comm::make_communicator(comm::Group::kWorld, cpu);
  metrics_ = device.is_cpu() ? control_ : comm::make_communicator(comm::Group::kWorld, device);
  if (sp_ == 1) return;
  seq_host_ = comm::split(comm::Group::kWorld, dp_rank_, sp_rank(), cpu,
                          device.is_cpu() ? "sequence-parallel" : "sequence-parallel-host");
  seq_group_ = std::make_unique<CommSeqGroup>(
      device.is_cpu()
          ? seq_host_
          : comm::split(comm::Group::kWorld, dp_rank_, sp_rank(), device, "sequence-parallel"));
}

bool RunTopology::any_rank(bool mine) const {
  return comm::any_rank(*control_, mine);
}

void RunTopology::reduce_counts(at::Tensor& t, comm::ReduceOp op) const {
  if (world_ > 1) control_->all_reduce(t, op)->wait();
}

data::Batch RunTopology::share(data::Batch b, int64_t halo) const {
  if (!seq_host_) return b;
  return share_batch(*seq_host_, std::move(b), halo, !device_.is_cpu());
}

}  // namespace fsdp::train
