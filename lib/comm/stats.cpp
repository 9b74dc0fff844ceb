// Names and statistics for the communication layer (comm/types.h).
#include <atomic>
#include <sstream>

#include "comm/types.h"

namespace fsdp::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

const char* op_type_name(OpType op) {
  switch (op) {
    case OpType::kAllGather:
      return "all_gather";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kAllReduce:
      return "all_reduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kAllToAll:
      return "all_to_all";
    default:
      return "?";
  }
}

void CommStats::record(OpType op, uint64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = ops_[static_cast<size_t>(op)];
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += seconds;
}

OpStats CommStats::get(OpType op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_[static_cast<size_t>(op)];
}

uint64_t CommStats::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t b = 0;
  for (const auto& s : ops_) b += s.bytes;
  return b;
}

double CommStats::total_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  double t = 0;
  for (const auto& s : ops_) t += s.seconds;
  return t;
}

namespace {
// Process-wide, not per thread: on a GPU, autograd runs the backward (and its waits) on its own
// device thread, not on the thread that called backward().
std::atomic<int> g_wait_phase{static_cast<int>(WaitPhase::kOther)};
}  // namespace

void set_wait_phase(WaitPhase phase) {
  g_wait_phase.store(static_cast<int>(phase), std::memory_order_relaxed);
}

WaitPhase wait_phase() {
  return static_cast<WaitPhase>(g_wait_phase.load(std::memory_order_relaxed));
}

void CommStats::record_exposed(WaitPhase phase, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  exposed_[static_cast<size_t>(phase)] += seconds;
}

std::array<double, static_cast<size_t>(WaitPhase::kCount)> CommStats::exposed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exposed_;
}

void CommStats::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  ops_ = {};
  exposed_ = {};
}

std::string CommStats::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].calls == 0) continue;
    os << op_type_name(static_cast<OpType>(i)) << ": " << ops_[i].calls << " calls, "
       << static_cast<double>(ops_[i].bytes) / (1024.0 * 1024.0) << " MiB, " << ops_[i].seconds
       << " s\n";
  }
  return os.str();
}

}  // namespace fsdp::comm
