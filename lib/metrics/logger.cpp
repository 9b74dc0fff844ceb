// MetricsLogger fan-out and the factory that builds rank 0's sinks from --report-to (sinks.h).
// Other ranks get an empty logger: metrics are averaged over ranks before they reach here.
#include <cstdlib>
#include <filesystem>

#include "core/env.h"
#include "core/error.h"
#include "metrics/sinks.h"

namespace fsdp::metrics {

void MetricsLogger::log(int64_t step, const Scalars& scalars) {
  for (auto& s : sinks_) s->log(step, scalars);
}
void MetricsLogger::heartbeat(int64_t step) {
  for (auto& s : sinks_) s->heartbeat(step);
}
void MetricsLogger::flush() {
  for (auto& s : sinks_) s->flush();
}
void MetricsLogger::close() {
  for (auto& s : sinks_) s->close();
}

std::string MetricsLogger::wandb_run_id() const {
  for (const auto& s : sinks_) {
    if (const auto* w = dynamic_cast<const WandbSink*>(s.get())) return w->run_id();
  }
  return "";
}

std::string MetricsLogger::mlflow_run_id() const {
  for (const auto& s : sinks_) {
    if (const auto* m = dynamic_cast<const MlflowSink*>(s.get())) return m->run_id();
  }
  return "";
}

namespace {

// --report-to mlflow: the flags first, then MLflow's environment variables (as SpecForge does),
// then a file store in the output dir (SpecForge: ./mlruns) and the experiment "fsdp-train".
MlflowOptions mlflow_options(const config::MetricsConfig& cfg, const SinkContext& ctx) {
  MlflowOptions m;
  m.tracking_uri = cfg.mlflow_tracking_uri;
  if (m.tracking_uri.empty()) m.tracking_uri = env::text("MLFLOW_TRACKING_URI").value_or("");
  if (m.tracking_uri.empty()) {
    // Absolute: "file://out/mlruns" would name a host "out".
    m.tracking_uri = "file://" + (std::filesystem::absolute(ctx.output_dir) / "mlruns").string();
  }
  m.experiment_name = cfg.mlflow_experiment_name;
  if (m.experiment_name.empty()) {
    m.experiment_name = env::text("MLFLOW_EXPERIMENT_NAME").value_or("fsdp-train");
  }
  m.run_name = cfg.mlflow_run_name;
  if (m.run_name.empty()) m.run_name = env::text("MLFLOW_RUN_NAME").value_or("");
  m.config_json = ctx.config_json;
  m.tags = {{"mlflow.source.name", "fsdp-train"}, {"fsdp-train.output_dir", ctx.output_dir}};
  if (ctx.resumed_step > 0) {
    m.tags.emplace_back("fsdp-train.resumed_from_step", std::to_string(ctx.resumed_step));
  }
  // MLFLOW_RUN_ID in the environment is the user's explicit choice: MLflow reads it itself.
  if (!env::is_set("MLFLOW_RUN_ID")) m.resume_run_id = ctx.mlflow_run_id;
  return m;
}

// --report-to wandb: the flags, and the run id of the checkpoint resumed from.
WandbOptions wandb_options(const config::MetricsConfig& cfg, const SinkContext& ctx) {
  WandbOptions w;
  w.project = cfg.wandb_project;
  w.name = cfg.wandb_name;
  w.dir = cfg.wandb_dir.empty() ? ctx.output_dir : cfg.wandb_dir;
  w.offline = cfg.wandb_offline;
  w.config_json = ctx.config_json;
  w.api_key = cfg.wandb_key;
  // WANDB_RUN_ID in the environment is the user's explicit choice: W&B reads it itself.
  if (!env::is_set("WANDB_RUN_ID")) w.resume_run_id = ctx.wandb_run_id;
  return w;
}

}  // namespace

std::unique_ptr<MetricsLogger> make_logger(const config::MetricsConfig& cfg,
                                           const SinkContext& ctx) {
  auto logger = std::make_unique<MetricsLogger>();
  if (ctx.rank != 0) return logger;
  FSDP_USAGE_CHECK(!ctx.output_dir.empty(), "metrics need --output-dir (metrics.jsonl goes there)",
                   "give --output-dir");
  logger->add(std::make_unique<ConsoleSink>(ctx.total_steps));
  logger->add(std::make_unique<JsonlSink>(ctx.output_dir + "/metrics.jsonl", ctx.resumed_step));
  for (const config::MetricSink sink : cfg.report_to) {
    switch (sink) {
      case config::MetricSink::kTensorBoard:
        logger->add(std::make_unique<TensorBoardSink>(
            cfg.tensorboard_dir.empty() ? ctx.output_dir + "/tensorboard" : cfg.tensorboard_dir,
            ctx.tensorboard_resumed_step));
        break;
      case config::MetricSink::kWandb:
        logger->add(std::make_unique<WandbSink>(wandb_options(cfg, ctx)));
        break;
      case config::MetricSink::kMlflow:
        logger->add(std::make_unique<MlflowSink>(mlflow_options(cfg, ctx)));
        break;
    }
  }
  return logger;
}

}  // namespace fsdp::metrics
