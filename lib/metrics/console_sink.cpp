// Rank-0 progress line (sinks.h ConsoleSink). On a terminal the line is rewritten in place every
// step; otherwise only log() prints, one line per call, so batch logs stay short. Never prints
// anything but the scalars it is given and the elapsed time.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "metrics/meters.h"
#include "metrics/sinks.h"

namespace fsdp::metrics {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const double* find(const Scalars& s, const std::string& name) {
  for (const auto& [k, v] : s)
    if (k == name) return &v;
  return nullptr;
}

std::string num(double v, const char* fmt) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[48];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string si(double v) {
  if (!std::isfinite(v)) return num(v, "%g");
  if (v >= 1e6) return num(v / 1e6, "%.2fM");
  if (v >= 1e3) return num(v / 1e3, "%.1fk");
  return num(v, "%.0f");
}

}  // namespace

ConsoleSink::ConsoleSink(int64_t total_steps, std::FILE* out, int is_tty)
    : total_steps_(total_steps), out_(out ? out : stdout), start_seconds_(now_seconds()) {
  if (is_tty >= 0) {
    tty_ = is_tty == 1;
  } else if (const auto mode = env::choice("FSDP_PROGRESS")) {
    tty_ = *mode == "tty";  // "lines": one line per log
  } else {
    // mpirun and srun hand ranks a pseudo-terminal even when their own output goes to a file:
    // under a launcher, in-place updates would flood logs, so print whole lines.
    const bool launched = env::is_set("OMPI_COMM_WORLD_SIZE") || env::is_set("PMI_SIZE") ||
                          env::is_set("SLURM_STEP_ID");
    tty_ = !launched && ::isatty(::fileno(out_)) == 1;
  }
}

std::string ConsoleSink::format_line(int64_t step, const Scalars& scalars) const {
  // Evaluation and epoch summaries: every step's accuracy on one line.
  for (const char* prefix : {"eval", "train_epoch"}) {
    const std::string p = prefix;
    if (!find(scalars, p + "/acc_0")) continue;
    std::string line =
        (p == "eval" ? "eval at step " : "epoch summary at step ") + std::to_string(step);
    if (const double* l = find(scalars, p + "/loss")) line += " | loss " + num(*l, "%.4f");
    line += " | acc";
    for (int i = 0; const double* a = find(scalars, p + "/acc_" + std::to_string(i)); ++i) {
      line += num(*a, " %.3f");
    }
    if (const double* a = find(scalars, p + "/accept_len"))
      line += " | accept_len " + num(*a, "%.2f");
    return line;
  }
  std::string line = "step " + std::to_string(step);
  if (total_steps_ > 0) {
    line += "/" + std::to_string(total_steps_) +
            num(100.0 * static_cast<double>(step) / static_cast<double>(total_steps_), " (%.1f%%)");
  }
  const double* loss = find(scalars, "train/loss");
  if (!loss) loss = find(scalars, "train/ploss_0");
  if (loss) line += " | loss " + num(*loss, "%.4f");
  if (const double* a = find(scalars, "train/acc_0")) line += " | acc_0 " + num(*a, "%.3f");
  if (const double* lr = find(scalars, "train/lr")) line += " | lr " + num(*lr, "%.3g");
  if (const double* g = find(scalars, "train/grad_norm")) line += " | gnorm " + num(*g, "%.3g");
  if (const double* t = find(scalars, "perf/tokens_per_s")) line += " | " + si(*t) + " tok/s";
  if (const double* m = find(scalars, "perf/mfu")) line += " | MFU " + num(100 * *m, "%.1f%%");
  // The time breakdown (docs/usage.md "Time breakdown"), when the loop measured one.
  if (find(scalars, "perf/forward_share")) {
    std::string parts;
    for (const auto& [key, label] :
         std::vector<std::pair<const char*, const char*>>{{"forward", "fwd"},
                                                          {"backward", "bwd"},
                                                          {"comm", "comm"},
                                                          {"optimizer", "opt"},
                                                          {"data", "data"},
                                                          {"other", "other"}}) {
      if (const double* v = find(scalars, std::string("perf/") + key + "_share"))
        parts += std::string(parts.empty() ? "" : " ") + label + num(100 * *v, " %.0f%%");
    }
    line += " | " + parts;
  }
  if (const double* eta = find(scalars, "perf/eta_s")) {
    line += " | ETA " + format_duration(*eta);
  }
  return line;
}

void ConsoleSink::log(int64_t step, const Scalars& scalars) {
  last_line_ = format_line(step, scalars);
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s\n", last_line_.c_str());
  } else {
    std::fprintf(out_, "%s\n", last_line_.c_str());
  }
  line_open_ = false;
  std::fflush(out_);
}

void ConsoleSink::heartbeat(int64_t step) {
  if (!tty_) return;
  const double elapsed = now_seconds() - start_seconds_;
  std::string line = "step " + std::to_string(step);
  if (total_steps_ > 0) line += "/" + std::to_string(total_steps_);
  line += " | " + format_duration(elapsed) + " elapsed";
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  line_open_ = true;
  std::fflush(out_);
}

void ConsoleSink::flush() {
  if (line_open_) {
    std::fputc('\n', out_);
    line_open_ = false;
  }
  std::fflush(out_);
}

}  // namespace fsdp::metrics
