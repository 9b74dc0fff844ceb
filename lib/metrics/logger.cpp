// MetricsLogger fan-out and the factory that builds rank 0's sinks from --report-to (sinks.h).
// Other ranks get an empty logger: metrics are averaged over ranks before they reach here.
#include <cstdlib>

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

std::unique_ptr<MetricsLogger> make_logger(const config::MetricsConfig& cfg,
                                           const SinkContext& ctx) {
  auto logger = std::make_unique<MetricsLogger>();
  if (ctx.rank != 0) return logger;
  FSDP_USAGE_CHECK(!ctx.output_dir.empty(), "metrics need --output-dir (metrics.jsonl goes there)",
                   "give --output-dir");
  logger->add(std::make_unique<ConsoleSink>(ctx.total_steps));
  logger->add(std::make_unique<JsonlSink>(ctx.output_dir + "/metrics.jsonl", ctx.resumed_step));
  for (const auto& sink : cfg.report_to) {
    if (sink == "tensorboard") {
      logger->add(std::make_unique<TensorBoardSink>(
          cfg.tensorboard_dir.empty() ? ctx.output_dir + "/tensorboard" : cfg.tensorboard_dir,
          ctx.tensorboard_resumed_step));
    } else if (sink == "wandb") {
      WandbOptions w;
      w.project = cfg.wandb_project;
      w.name = cfg.wandb_name;
      w.dir = ctx.output_dir;
      w.config_json = ctx.config_json;
      w.api_key = cfg.wandb_key;
      // WANDB_RUN_ID in the environment is the user's explicit choice: W&B reads it itself.
      if (!env::is_set("WANDB_RUN_ID")) w.resume_run_id = ctx.wandb_run_id;
      logger->add(std::make_unique<WandbSink>(w));
    }
  }
  return logger;
}

}  // namespace fsdp::metrics
