// Throughput and resource meters for the training loop: tokens/s, MFU against a settable peak,
// peak memory (host and device) and the time shares of data wait, communication and compute.
// Pure bookkeeping: never synchronises a device or talks to other ranks by itself.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace fsdp {
class TimeAccumulator;
}

namespace fsdp::metrics {

// Dense bf16 peak TFLOP/s of a GPU from its name ("NVIDIA H100 80GB HBM3" -> 989,
// "NVIDIA A100-SXM4-80GB" -> 312). Unset for unknown devices and for the CPU.
std::optional<double> known_peak_tflops(const std::string& device_name);

// Name of the device ("cpu", or the GPU's product name when a GPU build runs on one).
std::string device_name(const c10::Device& device);
// Total memory of a GPU in bytes (0 for the CPU or when the runtime cannot say): the figure the
// start-up memory check compares the estimate with.
uint64_t device_total_memory(const c10::Device& device);

// The peak used for MFU: the user's --mfu-peak-tflops when set, else the known GPU table, else
// unset (MFU is then reported as n/a).
std::optional<double> resolve_peak_tflops(std::optional<double> user_peak,
                                          const c10::Device& device);

// Accumulates steps over a logging window and since start. Feed it the tokens and the counted
// FLOPs of each optimizer step (model FLOP count x tokens; per rank) and the step's wall time.
class ThroughputMeter {
 public:
  explicit ThroughputMeter(std::optional<double> peak_tflops = std::nullopt)
      : peak_tflops_(peak_tflops) {}

  void add_step(int64_t tokens, double flops, double seconds);

  // Over the current window (since the last reset_window()).
  double tokens_per_second() const;
  double tflops_per_second() const;
  // achieved / peak in [0, ...); unset when no peak is known.
  std::optional<double> mfu() const;
  int64_t window_steps() const { return window_steps_; }
  void reset_window();

  // Since construction.
  int64_t total_steps() const { return total_steps_; }
  int64_t total_tokens() const { return total_tokens_; }
  double total_seconds() const { return total_seconds_; }
  // Seconds left for `remaining_steps` at the mean step time since start (0 before any step).
  double eta_seconds(int64_t remaining_steps) const;

 private:
  std::optional<double> peak_tflops_;
  int64_t window_steps_ = 0, window_tokens_ = 0;
  double window_flops_ = 0, window_seconds_ = 0;
  int64_t total_steps_ = 0, total_tokens_ = 0;
  double total_seconds_ = 0;
};

struct MemoryStats {
  int64_t host_peak_rss_bytes = 0;           // getrusage maxrss of this process
  int64_t device_peak_allocated_bytes = -1;  // caching allocator peak; -1 on the CPU
  int64_t device_peak_reserved_bytes = -1;
};

// Peak memory of this process on `device` (host always; the device's caching allocator for an
// accelerator, through LibTorch's generic device-allocator API).
MemoryStats peak_memory(const c10::Device& device);
// Resets the device allocator's peak counters (no-op on the CPU; maxrss cannot be reset).
void reset_peak_memory(const c10::Device& device);

// Shares of wall time spent in each accumulator entry (e.g. "data", "comm", "compute") over
// `wall_seconds`; entries are clamped to [0, 1]. "other" gets what is left when positive.
std::map<std::string, double> time_shares(const TimeAccumulator& acc, double wall_seconds);

// "1.23 GiB", "512 MiB" for logs.
std::string format_bytes(int64_t bytes);
// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace fsdp::metrics
