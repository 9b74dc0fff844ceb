// MLflow sink (sinks.h): runs the embedded bridge script under Python with the official mlflow
// package in a side process (bridge_process.h) and streams JSON lines to it, as the W&B sink
// does.
#include <nlohmann/json.hpp>

#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "metrics/bridge_process.h"
#include "metrics/sinks.h"

namespace fsdp::metrics {

namespace {

// The bridge's first line: where the run lives and what it records up front.
nlohmann::json init_message(const MlflowOptions& options) {
  nlohmann::json init;
  init["tracking_uri"] = options.tracking_uri;
  init["experiment_name"] =
      options.experiment_name.empty() ? "fsdp-train" : options.experiment_name;
  init["run_name"] = options.run_name;
  init["config"] = options.config_json.empty() ? nlohmann::json::object()
                                               : nlohmann::json::parse(options.config_json);
  nlohmann::json tags = nlohmann::json::object();
  for (const auto& [k, v] : options.tags) tags[k] = v;
  init["tags"] = tags;
  if (!options.resume_run_id.empty()) init["run_id"] = options.resume_run_id;
  return nlohmann::json{{"init", init}};
}

}  // namespace

MlflowSink::MlflowSink(const MlflowOptions& options) {
  detail::BridgeSpec spec;
  spec.name = "mlflow";
  spec.what = "MLflow";
  spec.python = detail::choose_python(options.python);
  spec.script = mlflow_bridge_script();
  spec.environment = detail::current_environment();
  spec.environment.push_back("PYTHONUNBUFFERED=1");
  spec.init_line = init_message(options).dump();
  spec.start_hint =
      "set FSDP_PYTHON to a Python with mlflow installed, or drop mlflow from --report-to";
  spec.not_ready_hint =
      "install mlflow into that Python (launch/setup.sh does; or pip install mlflow-skinny) or "
      "set FSDP_PYTHON; check --mlflow-tracking-uri (MLFLOW_TRACKING_URI) and the server's "
      "credentials; or drop mlflow from --report-to";
  bridge_ = std::make_unique<detail::BridgeProcess>(spec);
  try {
    const auto j = nlohmann::json::parse(bridge_->ready());
    run_id_ = j.value("run_id", "");
    experiment_id_ = j.value("experiment_id", "");
    tracking_uri_ = j.value("tracking_uri", "");
  } catch (const nlohmann::json::exception&) {
  }
  FSDP_LOG(kInfo) << "MLflow run " << run_id_ << " (experiment " << experiment_id_ << ") at "
                  << tracking_uri_;
}

MlflowSink::~MlflowSink() {
  close();
}

void MlflowSink::log(int64_t step, const Scalars& scalars) {
  if (!bridge_) return;
  bridge_->send(detail::scalars_line(step, scalars), "MLflow");
}

void MlflowSink::close() {
  if (!bridge_) return;
  // Closed while an exception unwinds the run (the destructor): the run ended in an error.
  const bool failed = std::uncaught_exceptions() > 0;
  bridge_->send(nlohmann::json{{"end", failed ? "FAILED" : "FINISHED"}}.dump() + "\n", "MLflow");
  const int code = bridge_->close();
  if (code != 0) FSDP_LOG(kWarn) << "MLflow bridge exited with code " << code;
  bridge_.reset();
}

}  // namespace fsdp::metrics
