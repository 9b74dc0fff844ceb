// A Python side process of a metric sink (W&B, MLflow): started as `python -c <script>`, fed JSON
// lines over a socket pair (send() with MSG_NOSIGNAL, so a dead bridge never kills the trainer
// with SIGPIPE), and answering one handshake line on its stdout once its run is open. Internal to
// lib/metrics.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::metrics::detail {

struct BridgeSpec {
  std::string name;    // the --report-to item ("wandb"): error messages name it
  std::string what;    // its display name in warnings ("W&B")
  std::string python;  // the interpreter
  std::string script;  // the bridge's text
  // The child's environment in full (NAME=value).
  std::vector<std::string> environment;
  std::string init_line;  // the first JSON line (without the newline)
  // The hint of the error when the bridge does not answer {"ready": ...}.
  std::string not_ready_hint;
  std::string start_hint;  // the hint when the interpreter cannot start
  double ready_timeout_s = 180.0;
};

class BridgeProcess {
 public:
  // Starts the bridge, sends spec.init_line and waits for its handshake line, which it returns
  // in ready(). Throws fsdp::Error when the interpreter cannot start or the bridge exits (its
  // messages went to our stderr).
  explicit BridgeProcess(const BridgeSpec& spec);
  ~BridgeProcess();
  BridgeProcess(const BridgeProcess&) = delete;
  BridgeProcess& operator=(const BridgeProcess&) = delete;
  const std::string& ready() const { return ready_; }
  // Sends one line; when the bridge has stopped reading, warns once (naming `what`) and drops
  // this and later lines.
  void send(const std::string& line, const char* what);
  // EOF to the bridge, then waits for it to finish (up to timeout_s). Returns its exit code, 0
  // when already closed. Idempotent.
  int close(double timeout_s = 300.0);

 private:
  int pid_ = -1;
  int fd_ = -1;
  std::string ready_;
};

// The environment of this process (the child's starting point).
std::vector<std::string> current_environment();

// The interpreter of a bridge: `explicit_python` when given, else $FSDP_PYTHON, else the build's
// Python (the setup venv) when that file exists, else python3.
std::string choose_python(const std::string& explicit_python);

// One logged step as a bridge reads it: {"step": N, "scalars": {...}} and a newline; NaN and Inf
// become null, which the bridges drop.
std::string scalars_line(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace fsdp::metrics::detail
