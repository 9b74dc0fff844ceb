// Step profiler (--profile, SpecForge's flags): records a LibTorch (Kineto) profile of a window
// of optimizer steps and writes, per rank, a Chrome/Perfetto trace and a summary table of the
// operators and GPU kernels that took the most time. Never changes what a step computes, and a
// profiler that cannot start or a trace that cannot be written is a warning, never the end of a
// run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::metrics {

struct ProfilerOptions {
  int64_t start_step = 30;  // profile optimizer steps start_step+1 .. start_step+num_steps
  int64_t num_steps = 4;
  bool record_shapes = false;  // operator input shapes in the trace
  bool gpu = false;            // also record GPU kernels and memcpys (CUPTI)
  std::string dir;             // created when missing
  int rank = 0;
};

// One row of the summary: events of one name on one kind of device.
struct ProfileRow {
  std::string device;  // "cpu" (operators and fsdp:: scopes, nested time included) or "gpu"
  std::string name;
  int64_t count = 0;
  double total_ms = 0;
};

class StepProfiler {
 public:
  explicit StepProfiler(ProfilerOptions options);
  ~StepProfiler();  // a profile still running is stopped without writing
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Before the first micro-batch of optimizer step `step` (1-based): starts the window.
  void before_step(int64_t step);
  // After optimizer step `step`: at the window's last step, stops and writes the files.
  void after_step(int64_t step);
  // Training ended inside the window: writes what was recorded.
  void finish();

  bool active() const { return active_; }
  bool written() const { return written_; }
  std::string trace_path() const;    // <dir>/rank<r>.trace.json
  std::string summary_path() const;  // <dir>/rank<r>.summary.txt
  // The summary of the written profile, longest first (empty before).
  const std::vector<ProfileRow>& summary() const { return summary_; }

 private:
  void stop_and_write();

  ProfilerOptions options_;
  bool active_ = false;
  bool written_ = false;
  bool failed_ = false;
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;
  std::vector<ProfileRow> summary_;
};

// The summary as an aligned text table (at most `rows` lines per device).
std::string format_profile_summary(const std::vector<ProfileRow>& summary, size_t rows);

}  // namespace fsdp::metrics
