// W&B sink (sinks.h): runs the embedded bridge script under Python with the official wandb SDK
// in a side process (bridge_process.h) and streams JSON lines to it. The API key only ever goes
// into the child's environment.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "metrics/bridge_process.h"
#include "metrics/sinks.h"

namespace fsdp::metrics {

namespace {

// Environment: ours, plus the key when given on the command line (never on the argv).
std::vector<std::string> bridge_environment(const WandbOptions& options) {
  std::vector<std::string> env_strings;
  for (auto& e : detail::current_environment()) {
    if (!options.api_key.empty() && e.rfind("WANDB_API_KEY=", 0) == 0) continue;
    if (options.offline && e.rfind("WANDB_MODE=", 0) == 0) continue;
    env_strings.push_back(std::move(e));
  }
  if (!options.api_key.empty()) env_strings.push_back("WANDB_API_KEY=" + options.api_key);
  if (options.offline) env_strings.push_back("WANDB_MODE=offline");
  env_strings.push_back("PYTHONUNBUFFERED=1");
  return env_strings;
}

// The bridge's first line: the arguments of wandb.init.
nlohmann::json init_message(const WandbOptions& options) {
  nlohmann::json init;
  init["project"] = options.project.empty() ? "fsdp-train" : options.project;
  init["name"] = options.name;
  init["dir"] = options.dir;
  init["config"] = options.config_json.empty() ? nlohmann::json::object()
                                               : nlohmann::json::parse(options.config_json);
  if (!options.resume_run_id.empty()) {
    init["id"] = options.resume_run_id;
    init["resume"] = true;
  }
  return nlohmann::json{{"init", init}};
}

}  // namespace

WandbSink::WandbSink(const WandbOptions& options) {
  detail::BridgeSpec spec;
  spec.name = "wandb";
  spec.what = "W&B";
  spec.python = detail::choose_python(options.python);
  spec.script = wandb_bridge_script();
  spec.environment = bridge_environment(options);
  spec.init_line = init_message(options).dump();
  spec.start_hint =
      "set FSDP_PYTHON to a Python with wandb installed, or drop wandb from --report-to";
  spec.not_ready_hint =
      "install wandb into that Python (pip install wandb) or set FSDP_PYTHON; without network set "
      "WANDB_MODE=offline; or drop wandb from --report-to";
  bridge_ = std::make_unique<detail::BridgeProcess>(spec);
  try {
    const auto j = nlohmann::json::parse(bridge_->ready());
    run_dir_ = j.value("run_dir", "");
    run_id_ = j.value("run_id", "");
  } catch (const nlohmann::json::exception&) {
  }
}

WandbSink::~WandbSink() {
  close();
}

void WandbSink::log(int64_t step, const Scalars& scalars) {
  if (!bridge_) return;
  bridge_->send(detail::scalars_line(step, scalars), "W&B");
}

void WandbSink::flush() {}

void WandbSink::close() {
  if (!bridge_) return;
  const int code = bridge_->close();
  if (code != 0) FSDP_LOG(kWarn) << "W&B bridge exited with code " << code;
  bridge_.reset();
}

}  // namespace fsdp::metrics
