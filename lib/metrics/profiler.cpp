// Step profiler (profiler.h) over LibTorch's Kineto profiler: prepare + enable on the training
// thread (autograd carries the state to its worker threads), disable, save the trace, and sum
// event durations by name for the summary.
#include "metrics/profiler.h"

#include <ATen/DeviceAccelerator.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "core/log.h"

namespace fsdp::metrics {

namespace {

namespace tp = torch::profiler::impl;

std::vector<ProfileRow> summarise(const torch::autograd::profiler::ProfilerResult& result) {
  std::map<std::pair<std::string, std::string>, ProfileRow> rows;
  for (const auto& e : result.events()) {
    // The fsdp:: scopes also come back as GPU annotations spanning whole phases; the GPU
    // table lists kernels and copies only (the CPU table has the scopes).
    if (e.isHiddenEvent() ||
        e.activityType() == static_cast<uint8_t>(libkineto::ActivityType::GPU_USER_ANNOTATION))
      continue;
    const bool gpu = e.deviceType() == c10::DeviceType::CUDA;
    auto& r = rows[{gpu ? "gpu" : "cpu", e.name()}];
    r.device = gpu ? "gpu" : "cpu";
    r.name = e.name();
    r.count += 1;
    r.total_ms += static_cast<double>(e.durationNs()) / 1e6;
  }
  std::vector<ProfileRow> out;
  out.reserve(rows.size());
  for (auto& [key, row] : rows) out.push_back(std::move(row));
  std::sort(out.begin(), out.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.device != b.device ? a.device < b.device : a.total_ms > b.total_ms;
  });
  return out;
}

void sync_device() {
  at::accelerator::synchronizeDevice(at::accelerator::getDeviceIndex());
}

}  // namespace

std::string format_profile_summary(const std::vector<ProfileRow>& summary, size_t rows) {
  std::ostringstream os;
  std::string device;
  size_t shown = 0;
  for (const auto& r : summary) {
    if (r.device != device) {
      device = r.device;
      shown = 0;
      os << (device == "gpu" ? "GPU kernels and copies" : "CPU operators and fsdp:: scopes")
         << " (total ms, nested time included; calls; name):\n";
    }
    if (shown++ >= rows) continue;
    os << "  " << std::setw(11) << std::fixed << std::setprecision(3) << r.total_ms << "  "
       << std::setw(7) << r.count << "  " << r.name << "\n";
  }
  return os.str();
}

StepProfiler::StepProfiler(ProfilerOptions options) : options_(std::move(options)) {
  first_step_ = options_.start_step + 1;
  last_step_ = options_.start_step + options_.num_steps;
}

StepProfiler::~StepProfiler() {
  if (!active_) return;
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {
    // Nothing to report to from a destructor: the run is already ending.
  }
}

std::string StepProfiler::trace_path() const {
  return options_.dir + "/rank" + std::to_string(options_.rank) + ".trace.json";
}

std::string StepProfiler::summary_path() const {
  return options_.dir + "/rank" + std::to_string(options_.rank) + ".summary.txt";
}

void StepProfiler::before_step(int64_t step) {
  if (active_ || written_ || failed_ || step != first_step_) return;
  try {
    std::filesystem::create_directories(options_.dir);
    // Kineto probes for GPUs even when asked for CPU activity only, and logs an ERROR line on a
    // machine without a driver; quiet its own log unless the user set a level.
    if (!options_.gpu) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    const tp::ProfilerConfig config(tp::ProfilerState::KINETO, options_.record_shapes);
    std::set<tp::ActivityType> activities{tp::ActivityType::CPU};
    if (options_.gpu) activities.insert(tp::ActivityType::CUDA);
    // The host runs ahead of the GPU (no synchronisation inside a step): wait for the earlier
    // steps' kernels so the trace holds the profiled steps' kernels only.
    if (options_.gpu) sync_device();
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    active_ = true;
    FSDP_LOG0(kInfo) << "profiling optimizer steps " << first_step_ << ".." << last_step_
                     << " into " << options_.dir;
  } catch (const std::exception& e) {
    failed_ = true;
    FSDP_LOG(kWarn) << "--profile: the profiler could not start (" << e.what()
                    << "); training goes on without it";
  }
}

void StepProfiler::after_step(int64_t step) {
  if (active_ && step >= last_step_) stop_and_write();
}

void StepProfiler::finish() {
  if (active_) {
    stop_and_write();
  } else if (!written_ && !failed_) {
    FSDP_LOG0(kWarn) << "--profile: step " << first_step_ << " (--profile-start-step + 1) "
                     << "was not trained by this run, nothing was profiled; choose a "
                     << "--profile-start-step among the steps it trains";
  }
}

void StepProfiler::stop_and_write() {
  active_ = false;
  try {
    // The last profiled step's kernels are still queued: collect them before stopping.
    if (options_.gpu) sync_device();
    auto result = torch::autograd::profiler::disableProfiler();
    result->save(trace_path());
    summary_ = summarise(*result);
    std::ofstream(summary_path()) << format_profile_summary(summary_, 50);
    written_ = true;
    FSDP_LOG0(kInfo) << "profile of steps " << first_step_ << ".." << last_step_ << ": "
                     << trace_path() << " (open in https://ui.perfetto.dev or chrome://tracing)\n"
                     << format_profile_summary(summary_, 12);
  } catch (const std::exception& e) {
    failed_ = true;
    FSDP_LOG(kWarn) << "--profile: the trace could not be written to " << options_.dir << " ("
                    << e.what() << "); training goes on";
  }
}

}  // namespace fsdp::metrics
