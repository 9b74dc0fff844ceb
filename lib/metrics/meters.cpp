// Meters (meters.h): throughput, MFU, peak memory and time shares. Device memory comes from
// LibTorch's generic accelerator allocator API, so no CUDA header or #ifdef is needed here.
#include "metrics/meters.h"

#include <ATen/DeviceAccelerator.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/timer.h"

namespace fsdp::metrics {

std::optional<double> known_peak_tflops(const std::string& device_name) {
  std::string n;
  for (char c : device_name) n += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  // Dense bf16 tensor-core peaks from the vendors' data sheets (no sparsity). PCIe/NVL variants
  // of H100 run at lower clocks and power: 756 (PCIe) and 835 (NVL) TFLOP/s.
  if (has("H200")) return 989.0;
  if (has("H100")) {
    if (has("PCIE")) return 756.0;
    if (has("NVL")) return 835.0;
    return 989.0;
  }
  if (has("GH200")) return 989.0;
  if (has("A100")) return 312.0;
  if (has("A800")) return 312.0;
  if (has("L40S")) return 362.0;
  if (has("B200")) return 2250.0;
  if (has("MI300X")) return 1307.0;
  return std::nullopt;
}

std::optional<double> resolve_peak_tflops(std::optional<double> user_peak,
                                          const c10::Device& device) {
  if (user_peak) return user_peak;
  if (device.is_cpu()) return std::nullopt;
  return known_peak_tflops(device_name(device));
}

void ThroughputMeter::add_step(int64_t tokens, double flops, double seconds) {
  ++window_steps_;
  window_tokens_ += tokens;
  window_flops_ += flops;
  window_seconds_ += seconds;
  ++total_steps_;
  total_tokens_ += tokens;
  total_seconds_ += seconds;
}

double ThroughputMeter::tokens_per_second() const {
  return window_seconds_ > 0 ? static_cast<double>(window_tokens_) / window_seconds_ : 0.0;
}

double ThroughputMeter::tflops_per_second() const {
  return window_seconds_ > 0 ? window_flops_ / window_seconds_ / 1e12 : 0.0;
}

std::optional<double> ThroughputMeter::mfu() const {
  if (!peak_tflops_ || *peak_tflops_ <= 0 || window_seconds_ <= 0) return std::nullopt;
  return tflops_per_second() / *peak_tflops_;
}

void ThroughputMeter::reset_window() {
  window_steps_ = 0;
  window_tokens_ = 0;
  window_flops_ = 0;
  window_seconds_ = 0;
}

double ThroughputMeter::eta_seconds(int64_t remaining_steps) const {
  if (total_steps_ == 0 || remaining_steps <= 0) return 0.0;
  return total_seconds_ / static_cast<double>(total_steps_) * static_cast<double>(remaining_steps);
}

MemoryStats peak_memory(const c10::Device& device) {
  MemoryStats m;
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) m.host_peak_rss_bytes = int64_t{ru.ru_maxrss} * 1024;
  if (!device.is_cpu() && at::accelerator::isAccelerator(device.type())) {
    const auto stats = at::accelerator::getDeviceStats(device.has_index() ? device.index() : 0);
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.device_peak_allocated_bytes = stats.allocated_bytes[agg].peak;
    m.device_peak_reserved_bytes = stats.reserved_bytes[agg].peak;
  }
  return m;
}

void reset_peak_memory(const c10::Device& device) {
  if (!device.is_cpu() && at::accelerator::isAccelerator(device.type())) {
    at::accelerator::resetPeakStats(device.has_index() ? device.index() : 0);
  }
}

std::map<std::string, double> time_shares(const TimeAccumulator& acc, double wall_seconds) {
  std::map<std::string, double> shares;
  if (wall_seconds <= 0) return shares;
  double sum = 0;
  for (const auto& [name, seconds] : acc.totals()) {
    const double s = std::clamp(seconds / wall_seconds, 0.0, 1.0);
    shares[name] = s;
    sum += s;
  }
  if (sum < 1.0) shares["other"] = 1.0 - sum;
  return shares;
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 0) return "n/a";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "n/a";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  }
  return buf;
}

}  // namespace fsdp::metrics
