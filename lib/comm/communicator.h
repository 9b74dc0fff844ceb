// The communicator interface (docs/architecture.md "Communication", shaped like c10d's Backend):
// rank/size and one virtual per collective. Collectives take tensors and derive count and dtype;
// they never take raw pointers. Every call returns a Work handle. Backends throw fsdp::Error naming
// themselves for unsupported dtypes, ops or devices. This header knows no backend.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "comm/types.h"

namespace fsdp::comm {

// Handle of an asynchronous collective. wait() blocks the host for CPU backends; for GPU
// backends it orders the caller's current stream after the collective without blocking the host.
// Output tensors must not be read, and inputs not modified, before wait() returns.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Non-blocking completion test; rethrows the collective's error when it failed.
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "nccl" (or "rccl"): for messages and reports only. Code that must know where a
  // collective can run asks device_type(), never the name.
  virtual std::string backend() const = 0;
  // The device type of the tensors this communicator accepts (kCPU for MPI, kCUDA for NCCL):
  // where to put a tensor that is about to be reduced or gathered.
  virtual c10::DeviceType device_type() const = 0;
  // The group this communicator spans: "world", "node", "cross-node", or a comm::split name.
  virtual std::string group_name() const = 0;

  // out[r*n:(r+1)*n] = shard of rank r, where n = shard.numel(); out.numel() == size()*n.
  virtual WorkPtr all_gather(const at::Tensor& shard, const at::Tensor& out,
                             const CollectiveOptions& opts = {}) = 0;
  // out = reduction over ranks of in[rank*n:(rank+1)*n], n = out.numel(); in.numel() == size()*n.
  virtual WorkPtr reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                                 const CollectiveOptions& opts = {}) = 0;
  // In place: t = reduction of t over ranks.
  virtual WorkPtr all_reduce(const at::Tensor& t, ReduceOp op,
                             const CollectiveOptions& opts = {}) = 0;
  // In place: t = root's t.
  virtual WorkPtr broadcast(const at::Tensor& t, int root, const CollectiveOptions& opts = {}) = 0;
  // Block j of `in` goes to rank j: out[r*n:(r+1)*n] = in[rank*n:(rank+1)*n] of rank r, where
  // n = in.numel() / size(). `in` and `out` are contiguous, do not overlap, and have the same
  // dtype and numel, divisible by size() (the same on every rank). With size() == 1, out = in.
  // Sequence parallelism (Ulysses) exchanges sequence and head shards with it.
  virtual WorkPtr all_to_all(const at::Tensor& in, const at::Tensor& out,
                             const CollectiveOptions& opts = {}) = 0;
  // Blocks until every rank of the group arrived (or the timeout aborts the job).
  virtual void barrier(const CollectiveOptions& opts = {}) = 0;

  // Waits for every collective issued so far (host-side for GPU backends).
  virtual void synchronize() = 0;

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }
  // Moves the exposed-wait records whose events have completed into stats() (GPU backends
  // measure them with events; MPI records them in wait() directly). Never blocks.
  virtual void settle_exposed() {}

 protected:
  CommStats stats_;
};

// True on every rank when `mine` is true on any rank: one int all-reduce (max) on `comm`, a CPU
// (MPI) communicator. The ranks' agreement on flags one rank may see alone (a stop signal, a
// failed read, a failed write).
bool any_rank(Communicator& comm, bool mine);

}  // namespace fsdp::comm
