// W&B sink (sinks.h): runs the embedded bridge script under Python with the official wandb SDK
// and streams JSON lines to it over a socket pair (send() with MSG_NOSIGNAL, so a dead bridge
// never kills the trainer with SIGPIPE). The API key only ever goes into the child's environment.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "metrics/sinks.h"

extern char** environ;

namespace fsdp::metrics {

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

// --report-to wandb's Python: the option, else $FSDP_PYTHON, else the setup venv, else python3.
std::string choose_python(const WandbOptions& options) {
  std::string python = options.python;
  if (python.empty()) {
    if (const auto py = env::text("FSDP_PYTHON")) {
      python = *py;
    } else if (!build_python().empty() && ::access(build_python().c_str(), X_OK) == 0) {
      python = build_python();  // the setup venv, where launch/setup.sh installs wandb
    } else {
      python = "python3";
    }
  }
  return python;
}

// Environment: ours, plus the key when given on the command line (never on the argv).
std::vector<std::string> bridge_environment(const WandbOptions& options) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    if (!options.api_key.empty() && std::strncmp(*e, "WANDB_API_KEY=", 14) == 0) continue;
    env_strings.emplace_back(*e);
  }
  if (!options.api_key.empty()) env_strings.push_back("WANDB_API_KEY=" + options.api_key);
  env_strings.push_back("PYTHONUNBUFFERED=1");
  return env_strings;
}

// Starts the bridge with child_stdin and child_stdout as its stdin and stdout and closes those
// ends here; on failure also closes our ends (our_in, our_out) before throwing.
pid_t spawn_bridge(const std::string& python, const WandbOptions& options, int child_stdin,
                   int child_stdout, int our_in, int our_out) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, child_stdin, 0);
  posix_spawn_file_actions_adddup2(&fa, child_stdout, 1);
  std::vector<std::string> env_strings = bridge_environment(options);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::string arg0 = python, arg1 = "-c", arg2 = wandb_bridge_script();
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, python.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(child_stdin);
  ::close(child_stdout);
  if (rc != 0) {
    ::close(our_in);
    ::close(our_out);
    FSDP_CHECK(false, str("--report-to wandb: cannot start '", python, "': ", std::strerror(rc)),
               "set FSDP_PYTHON to a Python with wandb installed, or drop wandb from --report-to");
  }
  return pid;
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
  const std::string python = choose_python(options);
  int in_pair[2];   // [0] trainer end, [1] child's stdin
  int out_pipe[2];  // child's stdout -> handshake
  FSDP_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) == 0,
             str("--report-to wandb: socketpair failed: ", std::strerror(errno)),
             "raise `ulimit -n` (out of file descriptors), or drop wandb from --report-to");
  FSDP_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0,
             str("--report-to wandb: pipe failed: ", std::strerror(errno)),
             "raise `ulimit -n` (out of file descriptors), or drop wandb from --report-to");
  pid_ = spawn_bridge(python, options, in_pair[1], out_pipe[1], in_pair[0], out_pipe[0]);
  fd_ = in_pair[0];

  send(init_message(options).dump() + "\n");
  // wandb.init can take a while (it starts its own service process); offline it is seconds.
  const std::string ready = read_line(out_pipe[0], 180.0);
  ::close(out_pipe[0]);
  if (ready.find("\"ready\"") == std::string::npos) {
    ::close(fd_);
    fd_ = -1;
    const int code = wait_child(pid_, 10.0);
    pid_ = -1;
    FSDP_CHECK(false,
               str("--report-to wandb: the W&B bridge (", python, ") did not start a run (exit ",
                   code, "); its messages are above"),
               "install wandb into that Python (pip install wandb) or set FSDP_PYTHON; without "
               "network set WANDB_MODE=offline; or drop wandb from --report-to");
  }
  try {
    const auto j = nlohmann::json::parse(ready);
    run_dir_ = j.value("run_dir", "");
    run_id_ = j.value("run_id", "");
  } catch (const nlohmann::json::exception&) {
  }
}

WandbSink::~WandbSink() {
  close();
}

void WandbSink::send(const std::string& line) {
  if (fd_ < 0) return;
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      FSDP_LOG(kWarn) << "W&B bridge stopped accepting metrics (" << std::strerror(errno)
                      << "); W&B logging is off for the rest of the run";
      ::close(fd_);
      fd_ = -1;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

void WandbSink::log(int64_t step, const Scalars& scalars) {
  nlohmann::json j;
  j["step"] = step;
  nlohmann::json s = nlohmann::json::object();
  for (const auto& [k, v] : scalars) s[k] = v;  // NaN/Inf become null; the bridge drops them
  j["scalars"] = s;
  send(j.dump() + "\n");
}

void WandbSink::flush() {}

void WandbSink::close() {
  if (fd_ >= 0) {
    ::shutdown(fd_, SHUT_WR);
    ::close(fd_);
    fd_ = -1;
  }
  if (pid_ > 0) {
    const int code = wait_child(pid_, 300.0);
    if (code != 0) FSDP_LOG(kWarn) << "W&B bridge exited with code " << code;
    pid_ = -1;
  }
}

}  // namespace fsdp::metrics
