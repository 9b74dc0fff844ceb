// Metric sinks behind one interface: the rank-0 console progress line, metrics.jsonl (always),
// TensorBoard event files written natively, and W&B and MLflow through their official Python
// SDKs in side processes. Sinks only record what they are given; averaging over ranks happens
// before. They never write secrets (the W&B key goes to the side process's environment only).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"

namespace fsdp::metrics {

namespace detail {
class BridgeProcess;  // bridge_process.h
}

// Ordered (name, value) pairs: "train/ploss_0", "train/acc_0", "train/lr", "perf/tokens_per_s".
using Scalars = std::vector<std::pair<std::string, double>>;

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Records the scalars of optimizer step `step` (1-based).
  virtual void log(int64_t step, const Scalars& scalars) = 0;
  // Called after every step by the loop; sinks that update live (a TTY progress bar) use it.
  virtual void heartbeat(int64_t step) {}
  virtual void flush() {}
  // Flushes and releases resources (waits for a side process to finish). Idempotent.
  virtual void close() {}
};

// Rank-0 progress line: "step 120/1000 (12.0%) | loss 3.214 | acc_0 0.412 | lr 9.87e-05 |
// 5.1k tok/s | ETA 4m10s". On a terminal heartbeat() rewrites one line in place; when stdout is
// not a terminal only log() prints, one line per call (one per --log-steps), so logs don't flood.
// Recognised scalars: train/loss (else train/ploss_0), train/acc_0, train/lr, train/grad_norm,
// perf/tokens_per_s, perf/mfu, perf/eta_s (the loop computes ETA with ThroughputMeter).
class ConsoleSink : public MetricsSink {
 public:
  // `out` defaults to stdout; is_tty: -1 detect with isatty(), 0/1 force (tests).
  ConsoleSink(int64_t total_steps, std::FILE* out = nullptr, int is_tty = -1);
  void log(int64_t step, const Scalars& scalars) override;
  void heartbeat(int64_t step) override;
  void flush() override;
  // The text log() prints for these scalars (tests).
  std::string format_line(int64_t step, const Scalars& scalars) const;

 private:
  int64_t total_steps_;
  std::FILE* out_;
  bool tty_;
  bool line_open_ = false;
  double start_seconds_;
  std::string last_line_;
};

// One JSON object per line: {"step": 10, "time": <unix seconds>, "train/ploss_0": ...}.
// Non-finite values are written as null (JSON has no NaN). Opened in append mode so a resumed run
// continues the same file.
// A write that fails (full disk) is a warning, never the end of the run: the file is cut back
// to its last whole line (record, for TensorBoard), and later logs write again once there is
// room. Both files are unbuffered: each log call is one write.
// resumed_step >= 0: the run continues from a checkpoint of that step; records of later steps
// already in the file (logged before an interruption, about to be logged again) move to
// <path without .jsonl>.superseded.jsonl, so that the file holds one timeline (as TensorBoard
// shows it, below). Nothing is deleted; the file is replaced atomically.
class JsonlSink : public MetricsSink {
 public:
  explicit JsonlSink(const std::string& path, int64_t resumed_step = -1);
  ~JsonlSink() override;
  void log(int64_t step, const Scalars& scalars) override;
  void flush() override;
  void close() override;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool failing_ = false;  // the last write failed (warned once until a write succeeds)
};

// TensorBoard event file events.out.tfevents.<unix time>.<host> in `dir`: TFRecord framing
// (length, masked CRC32C of the length, payload, masked CRC32C of the payload) around
// hand-encoded Event protos (wall_time, step, summary { value { tag, simple_value } }).
// resumed_step >= 0: the run continues from a checkpoint of that step, and the file starts with
// a SessionLog START event at the next step, from which TensorBoard drops the earlier files'
// records of the later steps (logged before an interruption, now logged again): one line per
// tag, as if the run had never stopped.
class TensorBoardSink : public MetricsSink {
 public:
  explicit TensorBoardSink(const std::string& dir, int64_t resumed_step = -1);
  ~TensorBoardSink() override;
  void log(int64_t step, const Scalars& scalars) override;
  void flush() override;
  void close() override;
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::FILE* file_ = nullptr;
  bool failing_ = false;
};

struct WandbOptions {
  std::string python;       // interpreter with wandb installed; empty: $FSDP_PYTHON, else the
                            // build's Python (build_python()) when it exists, else python3
  std::string project;      // --wandb-project (empty: "fsdp-train")
  std::string name;         // --wandb-name (empty: W&B picks)
  std::string dir;          // where W&B writes its run directory (the output dir)
  std::string config_json;  // the effective configuration (no secrets) for wandb.init(config=)
  std::string api_key;      // --wandb-key: put in the side process's environment only
  bool offline = false;     // --wandb-offline: WANDB_MODE=offline in the side process
  // Continue this W&B run (a resumed training run); empty: a new run (W&B picks the id, or
  // takes WANDB_RUN_ID from the environment).
  std::string resume_run_id;
};

// Starts `python -c <bridge>` (lib/metrics/wandb_bridge.py, embedded at build time) and pipes
// JSON lines to it: one init line, one line per log(), then EOF on close(), after which the bridge
// calls wandb.finish() and exits. WANDB_MODE=offline in the environment works without network.
// Throws fsdp::Error when the interpreter cannot start or wandb is not importable.
class WandbSink : public MetricsSink {
 public:
  explicit WandbSink(const WandbOptions& options);
  ~WandbSink() override;
  void log(int64_t step, const Scalars& scalars) override;
  void flush() override;
  void close() override;
  // The W&B run directory the bridge reported (offline runs: <dir>/wandb/offline-run-*/files).
  const std::string& run_dir() const { return run_dir_; }
  // The W&B run id (recorded in checkpoints, so that a resumed run continues the same run).
  const std::string& run_id() const { return run_id_; }

 private:
  std::unique_ptr<detail::BridgeProcess> bridge_;
  std::string run_dir_;
  std::string run_id_;
};

struct MlflowOptions {
  std::string python;           // as WandbOptions::python
  std::string tracking_uri;     // --mlflow-tracking-uri, else MLFLOW_TRACKING_URI, else
                                // <output dir>/mlruns (a local file store)
  std::string experiment_name;  // --mlflow-experiment-name, else MLFLOW_EXPERIMENT_NAME, else
                                // "fsdp-train"
  std::string run_name;         // --mlflow-run-name, else MLFLOW_RUN_NAME; empty: MLflow picks
  std::string config_json;      // the effective configuration (no secrets), logged as params
  // Tags of the run (set again on a resume, so they hold the latest values).
  std::vector<std::pair<std::string, std::string>> tags;
  // Continue this MLflow run (a resumed training run); empty: a new run, or the one
  // MLFLOW_RUN_ID in the environment names (MLflow reads it itself).
  std::string resume_run_id;
};

// Starts `python -c <bridge>` (lib/metrics/mlflow_bridge.py, embedded at build time) with the
// official mlflow package (mlflow-skinny is enough) and pipes JSON lines to it like WandbSink:
// mlflow.log_metrics(step=) per log(), the configuration as params (values cut to MLflow's
// length limit), the tags, mlflow.end_run() on close(). Credentials (MLFLOW_TRACKING_TOKEN, ...)
// stay in the environment, which the side process inherits. Throws fsdp::Error when the
// interpreter cannot start, mlflow is not importable or the run cannot be opened.
class MlflowSink : public MetricsSink {
 public:
  explicit MlflowSink(const MlflowOptions& options);
  ~MlflowSink() override;
  void log(int64_t step, const Scalars& scalars) override;
  void close() override;
  // The MLflow run id (recorded in checkpoints, so that a resumed run continues the same run).
  const std::string& run_id() const { return run_id_; }
  // The tracking URI and experiment id the run lives in (tests, the start-up line).
  const std::string& tracking_uri() const { return tracking_uri_; }
  const std::string& experiment_id() const { return experiment_id_; }

 private:
  std::unique_ptr<detail::BridgeProcess> bridge_;
  std::string run_id_;
  std::string tracking_uri_;
  std::string experiment_id_;
};

// Fans out to several sinks; the loop talks to this one.
class MetricsLogger : public MetricsSink {
 public:
  void add(std::unique_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }
  void log(int64_t step, const Scalars& scalars) override;
  void heartbeat(int64_t step) override;
  void flush() override;
  void close() override;
  size_t size() const { return sinks_.size(); }
  // The id of the W&B run being logged to; empty without a W&B sink.
  std::string wandb_run_id() const;
  // The id of the MLflow run being logged to; empty without an MLflow sink.
  std::string mlflow_run_id() const;

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

struct SinkContext {
  int rank = 0;  // only rank 0 gets sinks; other ranks get an empty logger
  int64_t total_steps = 0;
  std::string output_dir;     // metrics.jsonl, tensorboard/, wandb/ (mlruns/) live here
  std::string config_json;    // effective configuration for W&B and MLflow
  std::string wandb_run_id;   // the W&B run of the checkpoint resumed from (continued when set)
  std::string mlflow_run_id;  // the MLflow run of the checkpoint resumed from (the same)
  int64_t resumed_step = -1;  // metrics.jsonl: records after this step move aside (-1: none)
  // The TensorBoard file's session start (-1: none). A --tensorboard-dir may be shared by other
  // runs, so a fresh start does not purge it; a resume or a restart does.
  int64_t tensorboard_resumed_step = -1;
};

// The sinks --report-to asks for: console + metrics.jsonl always, plus tensorboard, wandb and
// mlflow.
std::unique_ptr<MetricsLogger> make_logger(const config::MetricsConfig& cfg,
                                           const SinkContext& ctx);

// The bridge scripts' texts (embedded from lib/metrics/wandb_bridge.py and mlflow_bridge.py).
const std::string& wandb_bridge_script();
const std::string& mlflow_bridge_script();
// The Python the build was configured with (CMake's FSDP_PYTHON: the setup venv, which has
// wandb and mlflow); empty when none was found.
const std::string& build_python();

}  // namespace fsdp::metrics
