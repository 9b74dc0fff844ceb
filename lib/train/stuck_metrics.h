// A run that trains nothing without an error (SpecForge issue #392: loss and accuracy exactly 0
// for a whole run when the loss masks are empty) is said loudly: ZeroMetricWatch follows the
// reports of one source (the evaluations, or the training log of a run without evaluations)
// and returns one error line when ploss or accuracy has been exactly 0 for N reports in a row.
// It only says so: it never stops the run, and it never logs itself (the caller does, on rank 0).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

// Reports in a row that it takes (evaluations, or logging steps).
inline constexpr int64_t kZeroMetricReports = 3;
// The training log is watched only after this many optimizer steps: a fresh draft may well be
// right nowhere on a small window at first.
inline constexpr int64_t kZeroMetricWarmupSteps = 50;

class ZeroMetricWatch {
 public:
  // `prefix`: "eval" or "train"; `reports`: what one report is called ("evaluations",
  // "logging steps").
  ZeroMetricWatch(std::string prefix, std::string reports, int64_t needed = kZeroMetricReports);
  // One report's scalars. Returns the error line due now, or "": at the report where the ploss
  // (every <prefix>/ploss_i) or the accuracy (every <prefix>/acc_i) has been exactly 0 for
  // `needed` reports in a row, one line naming the metric(s), the count, the likely causes and a
  // hint. Once per streak: a non-zero report starts the count again. A report without those
  // metrics changes nothing.
  std::string observe(const std::vector<std::pair<std::string, double>>& scalars);

 private:
  std::string prefix_, reports_;
  int64_t needed_;
  int64_t zero_ploss_ = 0, zero_acc_ = 0;
};

}  // namespace fsdp::train
