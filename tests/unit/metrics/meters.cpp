// Meters: known GPU peaks, MFU and tokens/s arithmetic, ETA, time shares, memory readings.
#include "metrics/meters.h"

#include <cstring>
#include <memory>

#include "core/timer.h"
#include "metrics_test_util.h"

using namespace fsdp::metrics;

TEST_CASE("known GPU peaks and the user's override", "[metrics]") {
  CHECK(known_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0);
  CHECK(known_peak_tflops("NVIDIA H200") == 989.0);
  CHECK(known_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0);
  CHECK(known_peak_tflops("NVIDIA H100 PCIe") == 756.0);
  CHECK_FALSE(known_peak_tflops("cpu").has_value());
  CHECK_FALSE(known_peak_tflops("Some Future GPU").has_value());
  const c10::Device cpu(c10::kCPU);
  CHECK_FALSE(resolve_peak_tflops(std::nullopt, cpu).has_value());
  CHECK(resolve_peak_tflops(2.5, cpu) == 2.5);
  CHECK(device_name(cpu) == "cpu");
}

TEST_CASE("tokens/s, TFLOP/s, MFU and ETA over a window", "[metrics]") {
  ThroughputMeter m(100.0);  // 100 TFLOP/s peak
  CHECK(m.tokens_per_second() == 0.0);
  CHECK_FALSE(m.mfu().has_value());
  m.add_step(1000, 20e12, 0.5);
  m.add_step(3000, 60e12, 1.5);
  CHECK(m.tokens_per_second() == Approx(2000.0));
  CHECK(m.tflops_per_second() == Approx(40.0));
  REQUIRE(m.mfu().has_value());
  CHECK(*m.mfu() == Approx(0.4));
  CHECK(m.eta_seconds(10) == Approx(10.0));  // 1 s per step on average
  m.reset_window();
  CHECK(m.window_steps() == 0);
  CHECK(m.total_steps() == 2);
  CHECK(m.total_tokens() == 4000);
  m.add_step(500, 0, 2.0);
  CHECK(m.tokens_per_second() == Approx(250.0));
  CHECK(m.eta_seconds(3) == Approx(4.0 / 3.0 * 3));
  ThroughputMeter no_peak;
  no_peak.add_step(10, 1e12, 1);
  CHECK_FALSE(no_peak.mfu().has_value());
}

TEST_CASE("time shares of data, comm and compute", "[metrics]") {
  fsdp::TimeAccumulator acc;
  acc.add("data", 1.0);
  acc.add("comm", 2.0);
  acc.add("compute", 5.0);
  const auto s = time_shares(acc, 10.0);
  CHECK(s.at("data") == Approx(0.1));
  CHECK(s.at("comm") == Approx(0.2));
  CHECK(s.at("compute") == Approx(0.5));
  CHECK(s.at("other") == Approx(0.2));
  CHECK(time_shares(acc, 0).empty());
}

TEST_CASE("host peak memory grows when memory is touched", "[metrics]") {
  const c10::Device cpu(c10::kCPU);
  const MemoryStats before = peak_memory(cpu);
  CHECK(before.host_peak_rss_bytes > (1 << 20));
  CHECK(before.device_peak_allocated_bytes == -1);
  const size_t n = 256u << 20;  // well above what the test process has used so far
  std::unique_ptr<char[]> block(new char[n]);
  std::memset(block.get(), 1, n);
  const MemoryStats after = peak_memory(cpu);
  CHECK(after.host_peak_rss_bytes >= before.host_peak_rss_bytes + static_cast<int64_t>(n / 2));
  CHECK(block[n - 1] == 1);
}

TEST_CASE("human-readable sizes and durations", "[metrics]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(3 * 1024 * 1024) == "3.00 MiB");
  CHECK(format_bytes(-1) == "n/a");
  CHECK(format_duration(12.4) == "12s");
  CHECK(format_duration(185) == "3m05s");
  CHECK(format_duration(3725) == "1h02m");
}
