// MPI backend for CPU tensors. Collectives run in issue order on one worker thread per
// communicator (so they overlap with the caller's compute) as non-blocking MPI calls polled
// against the timeout. bf16/fp16 reductions run in fp32 (MPI has no bf16 type). Counts above
// the MPI int limit are split into chunks. Private to lib/comm; reach it through runtime.h.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/runtime.h"
#include "comm/watchdog.h"

namespace fsdp::comm::detail {

// Tunables read from the environment once per communicator; their defaults and bounds are the
// rows of core/env.cpp's table (docs/usage.md, Environment variables).
struct MpiTuning {
  // Reduce-scatter inputs at least this large go through Allreduce + slice (faster on Open MPI
  // shared memory for large messages, see comm-bench). FSDP_MPI_RS_ALLREDUCE_BYTES.
  int64_t rs_allreduce_min_bytes = 0;
  // Largest element count per MPI call (MPI counts are int). FSDP_MPI_MAX_COUNT (tests).
  int64_t max_count = 0;
};
MpiTuning mpi_tuning_from_env();

class MpiCommunicator final : public Communicator {
 public:
  // `name` is what group_name() reports. With `owns_comm` the communicator frees `comm` when
  // destroyed (the sub-groups of comm::split); the runtime's groups are freed by finalize().
  MpiCommunicator(std::string name, MPI_Comm comm, bool owns_comm);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  c10::DeviceType device_type() const override { return c10::kCPU; }
  std::string group_name() const override { return name_; }

  WorkPtr all_gather(const at::Tensor& shard, const at::Tensor& out,
                     const CollectiveOptions& opts) override;
  WorkPtr reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                         const CollectiveOptions& opts) override;
  WorkPtr all_reduce(const at::Tensor& t, ReduceOp op, const CollectiveOptions& opts) override;
  WorkPtr broadcast(const at::Tensor& t, int root, const CollectiveOptions& opts) override;
  WorkPtr all_to_all(const at::Tensor& in, const at::Tensor& out,
                     const CollectiveOptions& opts) override;
  void barrier(const CollectiveOptions& opts) override;
  void synchronize() override;

  const MpiTuning& tuning() const { return tuning_; }
  void set_tuning(const MpiTuning& t) { tuning_ = t; }

 private:
  struct Task;
  class MpiWork;
  WorkPtr enqueue(std::unique_ptr<Task> task);
  void worker_loop();
  void run_task(Task& task);

  std::string name_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owns_comm_ = false;
  int rank_ = 0;
  int size_ = 1;
  MpiTuning tuning_;
  std::unique_ptr<ArrivalTracker> tracker_;
  int64_t seq_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Task>> queue_;
  std::shared_ptr<Work> last_;
  bool stop_ = false;
  // Host threads blocked in wait() on this communicator's work: while > 0 the worker polls MPI
  // without backing off (the waiting thread's core is idle, and MPI only progresses inside
  // MPI calls).
  std::shared_ptr<std::atomic<int>> waiters_ = std::make_shared<std::atomic<int>>(0);
  std::thread worker_;
};

}  // namespace fsdp::comm::detail
