// Timers: a steady-clock stopwatch and named accumulators for time shares (data wait, comm,
// compute). Timing only; never synchronises devices by itself.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

namespace fsdp {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void reset() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double millis() const { return seconds() * 1e3; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// Thread-safe sums of seconds and counts per name.
class TimeAccumulator {
 public:
  void add(const std::string& name, double seconds);
  double total(const std::string& name) const;
  long count(const std::string& name) const;
  std::map<std::string, double> totals() const;
  void reset();

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::pair<double, long>> acc_;
};

// Adds the lifetime of the scope to an accumulator entry.
class ScopedTimer {
 public:
  ScopedTimer(TimeAccumulator& acc, std::string name) : acc_(acc), name_(std::move(name)) {}
  ~ScopedTimer() { acc_.add(name_, watch_.seconds()); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  TimeAccumulator& acc_;
  std::string name_;
  Stopwatch watch_;
};

}  // namespace fsdp
