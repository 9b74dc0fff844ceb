// Plain types shared by every communication backend: reduction ops, per-call options and the
// traffic statistics later issues use to check that ZeRO traffic matches theory.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace fsdp::comm {

enum class ReduceOp { kSum, kAvg, kMax };
const char* reduce_op_name(ReduceOp op);

enum class OpType {
  kAllGather = 0,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kAllToAll,
  kCount
};
const char* op_type_name(OpType op);

// Every collective takes options (c10d style). A zero timeout means the communicator's default
// (--dist-timeout, 20 minutes unless configured).
struct CollectiveOptions {
  std::chrono::milliseconds timeout{0};
};

struct OpStats {
  uint64_t calls = 0;
  // Payload bytes as nccl-tests counts them: all_gather the gathered output, reduce_scatter and
  // all_to_all the full input, all_reduce and broadcast the tensor. Bus bandwidth is derived from
  // these.
  uint64_t bytes = 0;
  double seconds = 0.0;
};

// The phase of the training step the process is in (forward, backward, optimizer, other), so
// that the time a collective's wait() holds up computation ("exposed" communication) is counted
// against the phase that waited (train/phase_timer.h). Process-wide; kOther by default.
enum class WaitPhase { kForward = 0, kBackward, kOptimizer, kOther, kCount };
void set_wait_phase(WaitPhase phase);  // this thread's phase
WaitPhase wait_phase();

// Thread-safe accumulation of bytes and time per operation type.
class CommStats {
 public:
  void record(OpType op, uint64_t bytes, double seconds);
  // Time computation waited for this communicator's collectives: host time blocked in wait()
  // (MPI), or on a GPU the gap between the moment the compute stream was made to wait and the
  // collective's end (NCCL, taken from events once both completed), per phase.
  void record_exposed(WaitPhase phase, double seconds);
  std::array<double, static_cast<size_t>(WaitPhase::kCount)> exposed() const;
  OpStats get(OpType op) const;
  uint64_t total_bytes() const;
  double total_seconds() const;
  void reset();
  // One line per op type with calls, MiB and seconds; empty ops omitted.
  std::string summary() const;

 private:
  mutable std::mutex mu_;
  std::array<OpStats, static_cast<size_t>(OpType::kCount)> ops_{};
  std::array<double, static_cast<size_t>(WaitPhase::kCount)> exposed_{};
};

}  // namespace fsdp::comm
