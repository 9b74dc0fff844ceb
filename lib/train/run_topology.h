// The run's topology: this rank and the world, the sequence-parallel groups of `sp` consecutive
// ranks and the data-parallel layout they leave (dp_world groups read different samples; this
// rank's group is dp_rank), the compute device, and the communicators over them: the CPU control
// communicator (flags, barriers, small counts), the metrics communicator on the compute device,
// and the sequence-parallel group. The trainer owns one; its parts ask it instead of keeping
// loose integers. Never decides what a collective means: it only says who takes part.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "data/batch.h"
#include "train/seq_group.h"

namespace fsdp::train {

class RunTopology {
 public:
  RunTopology() = default;
  // The ranks only (config::validate checks that sp divides world); connect() makes the
  // communicators once the device is known.
  RunTopology(int rank, int world, int64_t sp);
  // Creates the control, metrics and (sp > 1) sequence-parallel communicators on `device`.
  // Collective over the world.
  void connect(const c10::Device& device);

  int rank() const { return rank_; }
  int world() const { return world_; }
  bool is_root() const { return rank_ == 0; }
  int sp() const { return sp_; }
  int sp_rank() const { return rank_ % sp_; }
  int dp_rank() const { return dp_rank_; }
  int dp_world() const { return dp_world_; }

  const c10::Device& device() const { return device_; }
  // Where the metrics communicator reduces (the CPU when it is the MPI control communicator).
  c10::Device metrics_device() const { return device_.is_cpu() ? c10::Device(c10::kCPU) : device_; }
  comm::Communicator& control() const { return *control_; }
  comm::Communicator* control_ptr() const { return control_.get(); }
  comm::Communicator& metrics() const { return *metrics_; }
  // The draft's sequence-parallel group; nullptr unless sp > 1.
  CommSeqGroup* seq_group() const { return seq_group_.get(); }

  // True on every rank when `mine` is true on any rank. Collective (control communicator).
  bool any_rank(bool mine) const;
  // All-reduces a small CPU tensor over the world on the control communicator (nothing to do
  // with one rank). Collective.
  void reduce_counts(at::Tensor& t, comm::ReduceOp op) const;
  // Sequence parallelism over a format read whole: the group's first rank broadcasts its sample
  // and every rank keeps its slice with `halo` (train::share_batch); the batch itself otherwise.
  data::Batch share(data::Batch b, int64_t halo) const;

 private:
  int rank_ = 0, world_ = 1, sp_ = 1, dp_rank_ = 0, dp_world_ = 1;
  c10::Device device_{c10::kCPU};
  std::shared_ptr<comm::Communicator> control_;  // world, CPU
  std::shared_ptr<comm::Communicator> metrics_;  // world, on the compute device
  std::unique_ptr<CommSeqGroup> seq_group_;      // sp > 1 only
  // sp > 1: the group on the host (share); seq_group_'s own communicator on the CPU.
  std::shared_ptr<comm::Communicator> seq_host_;
};

}  // namespace fsdp::train
