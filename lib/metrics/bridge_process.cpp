// Side processes of the Python-SDK sinks (bridge_process.h): posix_spawn of `python -c <script>`,
// a socket pair for the JSON lines and a pipe for the one handshake line.
#include "metrics/bridge_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "metrics/sinks.h"

extern char** environ;

namespace fsdp::metrics::detail {

namespace {

// Reads one line from fd with a deadline; empty string on EOF or timeout.
std::string read_line(int fd, double timeout_s) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int>(timeout_s * 1e3));
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n <= 0) return "";
    if (c == '\n') return line;
    line += c;
  }
  return "";
}

int wait_child(int pid, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int>(timeout_s * 1e3));
  int status = 0;
  while (true) {
    const int r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Starts the bridge with child_stdin and child_stdout as its stdin and stdout and closes those
// ends here; on failure also closes our ends (our_in, our_out) before throwing.
pid_t spawn_bridge(const BridgeSpec& spec, int child_stdin, int child_stdout, int our_in,
                   int our_out) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, child_stdin, 0);
  posix_spawn_file_actions_adddup2(&fa, child_stdout, 1);
  std::vector<std::string> env_strings = spec.environment;
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::string arg0 = spec.python, arg1 = "-c", arg2 = spec.script;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, spec.python.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(child_stdin);
  ::close(child_stdout);
  if (rc != 0) {
    ::close(our_in);
    ::close(our_out);
    FSDP_CHECK(
        false,
        str("--report-to ", spec.name, ": cannot start '", spec.python, "': ", std::strerror(rc)),
        spec.start_hint);
  }
  return pid;
}

}  // namespace

std::vector<std::string> current_environment() {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  return env_strings;
}

std::string choose_python(const std::string& explicit_python) {
  if (!explicit_python.empty()) return explicit_python;
  if (const auto py = env::text("FSDP_PYTHON")) return *py;
  // The setup venv, where launch/setup.sh installs wandb and mlflow.
  if (!build_python().empty() && ::access(build_python().c_str(), X_OK) == 0) return build_python();
  return "python3";
}

BridgeProcess::BridgeProcess(const BridgeSpec& spec) {
  int in_pair[2];   // [0] trainer end, [1] child's stdin
  int out_pipe[2];  // child's stdout -> handshake
  const std::string label = "--report-to " + spec.name;
  const std::string fds_hint =
      str("raise `ulimit -n` (out of file descriptors), or drop ", spec.name, " from --report-to");
  FSDP_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) == 0,
             str(label, ": socketpair failed: ", std::strerror(errno)), fds_hint);
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(in_pair[0]);
    ::close(in_pair[1]);
    FSDP_FAIL(str(label, ": pipe failed: ", std::strerror(e)), fds_hint);
  }
  pid_ = spawn_bridge(spec, in_pair[1], out_pipe[1], in_pair[0], out_pipe[0]);
  fd_ = in_pair[0];

  send(spec.init_line + "\n", spec.what.c_str());
  // The SDK's run start can take a while (W&B starts its own service process); locally seconds.
  ready_ = read_line(out_pipe[0], spec.ready_timeout_s);
  ::close(out_pipe[0]);
  if (ready_.find("\"ready\"") == std::string::npos) {
    ::close(fd_);
    fd_ = -1;
    const int code = wait_child(pid_, 10.0);
    pid_ = -1;
    FSDP_FAIL(str(label, ": the ", spec.what, " bridge (", spec.python,
                  ") did not start a run (exit ", code, "); its messages are above"),
              spec.not_ready_hint);
  }
}

BridgeProcess::~BridgeProcess() {
  close();
}

void BridgeProcess::send(const std::string& line, const char* what) {
  if (fd_ < 0) return;
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      FSDP_LOG(kWarn) << what << " bridge stopped accepting metrics (" << std::strerror(errno)
                      << "); " << what << " logging is off for the rest of the run";
      ::close(fd_);
      fd_ = -1;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

int BridgeProcess::close(double timeout_s) {
  if (fd_ >= 0) {
    ::shutdown(fd_, SHUT_WR);
    ::close(fd_);
    fd_ = -1;
  }
  int code = 0;
  if (pid_ > 0) {
    code = wait_child(pid_, timeout_s);
    pid_ = -1;
  }
  return code;
}

std::string scalars_line(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  nlohmann::json j;
  j["step"] = step;
  nlohmann::json s = nlohmann::json::object();
  for (const auto& [k, v] : scalars) s[k] = v;
  j["scalars"] = s;
  return j.dump() + "\n";
}

}  // namespace fsdp::metrics::detail
