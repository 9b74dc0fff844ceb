// mpirun relaunch and supervision (launcher.h).
#include "launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "core/env.h"
#include "error_block.h"
#include "train/signals.h"

namespace fsdp::app {

namespace {
// Launcher limits (docs/usage.md): more ranks per node than any machine has GPUs or sensible CPU
// ranks, more nodes and restarts than a job would use.
constexpr int kMaxRanksPerNode = 1024;
constexpr int kMaxNodes = 65536;
constexpr int kMaxRestarts = 1000;
// The least host memory one rank on this node takes before any model: LibTorch, MPI and the
// allocator's arenas (a toy run's rank measures about twice this). More ranks than the node's
// memory holds at this floor cannot start: refused up front instead of ending in the OOM killer.
constexpr long long kMinRankMemoryMiB = 128;

bool parse_int(const std::string& s, int min, int max, int* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < min || v > max) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string self_path(const char* argv0) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, n);
  return argv0;
}

// This node's memory in MiB: physical memory, or the cgroup's limit when lower (a container);
// 0 when unknown.
long long node_memory_mib() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  long long mib = pages > 0 && page > 0 ? static_cast<long long>(pages) * page / (1 << 20) : 0;
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when unlimited
  long long bytes = 0;
  if (limit >> bytes && bytes > 0 && (mib == 0 || bytes / (1 << 20) < mib)) mib = bytes >> 20;
  return mib;
}

// The same format as every other usage error (cli.cpp): the message, then what to do.
int usage_error(const std::string& msg, const std::string& hint) {
  write_error_block(msg, hint);
  return 2;
}

// The launcher flags, taken out of the command line before anything else parses it.
struct LauncherArgs {
  int nproc = 0;  // 0: no --nproc-per-node
  int nnodes = 1;
  int max_restarts = -1;  // -1: not given
  std::string hostfile;
  bool dry_run = false;
  std::vector<std::string> rest;  // every other argument, in order
  std::vector<int> rest_index;    // and its index in argv
};

// The integer launcher flags: name, field, bounds (docs/usage.md) and what to give instead.
struct IntFlag {
  const char* name;
  int LauncherArgs::*field;
  int min, max;
  const char* hint;
};
constexpr IntFlag kIntFlags[] = {
    {"--nproc-per-node", &LauncherArgs::nproc, 1, kMaxRanksPerNode,
     "give the ranks to start on each node: one per GPU, or a few on the CPU (e.g. "
     "--nproc-per-node 2)"},
    {"--nnodes", &LauncherArgs::nnodes, 1, kMaxNodes,
     "give the number of nodes listed in --hostfile, e.g. --nnodes 2"},
    {"--max-restarts", &LauncherArgs::max_restarts, 0, kMaxRestarts,
     "give how often a failed job is restarted, e.g. --max-restarts 3"},
};
constexpr const char* kHostfileHint =
    "give a readable Open MPI hostfile listing the nodes (docs/multi-node.md)";

enum class Value { kAbsent, kMissing, kFound };
// argv[*i] as `flag VALUE` (advancing *i) or `flag=VALUE`.
Value flag_value(int argc, char** argv, int* i, const std::string& flag, std::string* out) {
  const std::string a = argv[*i];
  if (a == flag) {
    if (*i + 1 >= argc) return Value::kMissing;
    *out = argv[++*i];
    return Value::kFound;
  }
  if (a.rfind(flag + "=", 0) != 0) return Value::kAbsent;
  *out = a.substr(flag.size() + 1);
  return Value::kFound;
}

// Returns 0, or 2 after printing the error for a bad or missing value.
int parse_launcher_flags(int argc, char** argv, LauncherArgs* args) {
  for (int i = 1; i < argc; ++i) {
    std::string v;
    Value got = Value::kAbsent;
    for (const IntFlag& f : kIntFlags) {
      got = flag_value(argc, argv, &i, f.name, &v);
      if (got == Value::kMissing)
        return usage_error(std::string(f.name) + " needs a value", f.hint);
      if (got == Value::kAbsent) continue;
      if (!parse_int(v, f.min, f.max, &(args->*f.field))) {
        return usage_error(std::string(f.name) + ": '" + v + "' is not an integer from " +
                               std::to_string(f.min) + " to " + std::to_string(f.max),
                           f.hint);
      }
      break;
    }
    if (got != Value::kAbsent) continue;
    got = flag_value(argc, argv, &i, "--hostfile", &args->hostfile);
    if (got == Value::kMissing) return usage_error("--hostfile needs a value", kHostfileHint);
    if (got == Value::kFound) {
      if (::access(args->hostfile.c_str(), R_OK) != 0)
        return usage_error("--hostfile: cannot read '" + args->hostfile + "'", kHostfileHint);
    } else if (std::string(argv[i]) == "--launch-dry-run") {
      args->dry_run = true;
    } else {
      args->rest.push_back(argv[i]);
      args->rest_index.push_back(i);
    }
  }
  return 0;
}

// The supervisor's view of stop signals. The handler only records; the wait loop passes the
// first SIGINT/SIGTERM/SIGHUP/SIGUSR1 (a scheduler's preemption warning) on to mpirun as SIGUSR1,
// which mpirun forwards to every rank (on every node), and the ranks save a checkpoint and exit
// cleanly (SIGTERM to mpirun would kill them a moment later). mpirun forwards a signal only to
// ranks that have started, so SIGUSR1 is repeated every 2 s until the job ends (the ranks keep
// one request). A second signal is passed on as SIGTERM: the user insists.
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_stop_count = 0;

extern "C" void on_launcher_signal(int sig) {
  g_stop_signal = sig;
  g_stop_count = g_stop_count + 1;
}

void install_launcher_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) ::sigaction(sig, &sa, nullptr);
}

// Variables passed to every rank by name (mpirun copies the whole environment only to ranks on
// this node): ours, NCCL's, W&B's (rank 0 may run on another node), the thread count, the
// library path and the Hugging Face cache locations (a repository id as --target-model-path). The
// launcher sets FSDP_LAUNCHED and the attempt/launch id itself.
std::vector<std::string> forwarded_variables() {
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
    if (name == "FSDP_LAUNCHED" || name == "FSDP_MPIRUN" || name == train::kRestartAttemptVar ||
        name == train::kLaunchIdVar)
      continue;
    if (starts("FSDP_") || starts("NCCL_") || starts("WANDB_") || starts("MLFLOW_") ||
        name == "OMP_NUM_THREADS" || name == "LD_LIBRARY_PATH" || name == "HF_HOME" ||
        name == "HF_HUB_CACHE" || name == "TRANSFORMERS_CACHE")
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string new_launch_id() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

// Starts the plan as a child in its own process group (a terminal's Ctrl-C reaches only this
// process, which turns it into the clean stop above) with stdin from /dev/null (a background
// process group must not read the terminal). Returns the child's pid, or -1 with the exec
// error in *err when mpirun could not be started.
pid_t start_child(const LaunchPlan& plan, int* err) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    *err = errno;
    return -1;
  }
  const pid_t parent = ::getpid();
  // Blocked across the fork: the child resets the handlers before a signal can reach it.
  train::block_stop_signals();
  const pid_t pid = ::fork();
  if (pid != 0) train::unblock_stop_signals();
  if (pid < 0) {
    *err = errno;
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return -1;
  }
  if (pid == 0) {
    ::close(pipefd[0]);
    ::setpgid(0, 0);
    // Killed with the launcher (even by SIGKILL): mpirun then stops the ranks.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) std::signal(sig, SIG_DFL);
    train::unblock_stop_signals();
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::close(devnull);
    }
    std::vector<char*> args;
    for (const auto& s : plan.argv) args.push_back(const_cast<char*>(s.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    const int e = errno;
    (void)!::write(pipefd[1], &e, sizeof(e));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a signal arriving before the child runs
  ::close(pipefd[1]);
  int e = 0;
  ssize_t n;
  do {
    n = ::read(pipefd[0], &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  ::close(pipefd[0]);
  if (n == static_cast<ssize_t>(sizeof(e))) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *err = e;
    return -1;
  }
  return pid;
}

// Whether process `pid` blocks `sig` and whether it has a handler for it (the SigBlk and SigCgt
// masks in /proc/PID/status); both false for a process that is gone.
struct SignalState {
  bool blocked = false, caught = false;
};
SignalState signal_state(pid_t pid, int sig) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  SignalState st;
  std::string line;
  while (std::getline(status, line)) {
    const bool blk = line.rfind("SigBlk:", 0) == 0, cgt = line.rfind("SigCgt:", 0) == 0;
    if (!blk && !cgt) continue;
    const bool bit = (std::strtoull(line.c_str() + 7, nullptr, 16) >> (sig - 1)) & 1ULL;
    (blk ? st.blocked : st.caught) = bit;
  }
  return st;
}

std::string exe_of(pid_t pid) {
  char buf[4096];
  const ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, n) : std::string();
}

// True when every child of `parent` (the ranks mpirun forked on this node) blocks or handles
// `sig` in its own program. A child that still runs mpirun's image, between fork and exec, or
// has not reached the front's block yet would die of it: mpirun forwards a signal to every rank
// it has forked, and with 64 ranks on 2 cores it was still forking them 3 s after the start.
bool children_protected(pid_t parent, int sig) {
  const std::string task_dir = "/proc/" + std::to_string(parent) + "/task";
  const std::string parent_exe = exe_of(parent);
  DIR* tasks = ::opendir(task_dir.c_str());
  if (!tasks) return false;
  bool ok = true;
  while (dirent* t = ::readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    std::ifstream children(task_dir + "/" + t->d_name + "/children");
    for (pid_t child; ok && children >> child;) {
      const SignalState st = signal_state(child, sig);
      ok = (st.blocked || st.caught) && exe_of(child) != parent_exe;
    }
  }
  ::closedir(tasks);
  return ok;
}

// Waits for the child, passing stop signals on (see on_launcher_signal).
int wait_child(pid_t pid) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto last_request = Clock::time_point{};
  bool terminated = false;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return 1;
    const auto now = Clock::now();
    if (g_stop_count >= 2 && !terminated) {
      ::kill(pid, SIGTERM);
      terminated = true;
    } else if (g_stop_count == 1 && now - started >= std::chrono::seconds(3) &&
               now - last_request >= std::chrono::seconds(2) &&
               ((signal_state(pid, SIGUSR1).caught && children_protected(pid, SIGUSR1)) ||
                now - started >= std::chrono::seconds(60))) {
      // Not before mpirun catches SIGUSR1 (it would end mpirun and orphan the ranks) and every
      // rank it forked here blocks or handles it (children_protected); not in the first 3 s
      // either. A wrapper in FSDP_MPIRUN that never shows a handler gets it after 60 s.
      ::kill(pid, SIGUSR1);
      last_request = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Sleeps up to `seconds`, returning early (false) when a stop signal arrives.
bool pause_unless_stopped(int seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (g_stop_signal != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return g_stop_signal == 0;
}
}  // namespace

LaunchPlan plan_launch(int nproc_per_node, int nnodes, const std::string& hostfile,
                       const std::string& self, const std::vector<std::string>& rest) {
  LaunchPlan p;
  p.argv.push_back(env::text("FSDP_MPIRUN").value_or("mpirun"));
  if (::geteuid() == 0) p.argv.push_back("--allow-run-as-root");
  const int total = nproc_per_node * nnodes;
  if (hostfile.empty()) {
    const unsigned cores = std::thread::hardware_concurrency();
    if (cores == 0 || static_cast<unsigned>(total) > cores) p.argv.push_back("--oversubscribe");
  } else {
    p.argv.insert(p.argv.end(), {"--hostfile", hostfile});
  }
  // Each rank runs intra-op threads of its own: do not pin it to one core.
  p.argv.insert(p.argv.end(), {"--bind-to", "none", "--map-by",
                               "ppr:" + std::to_string(nproc_per_node) + ":node"});
  p.argv.insert(p.argv.end(), {"-np", std::to_string(total)});
  // Ranks on other nodes get the variables that matter for us, NCCL, threads and W&B (by name:
  // -x VAR takes the value from this environment, so no value, a W&B key included, appears on
  // a command line).
  for (const std::string& var : forwarded_variables()) p.argv.insert(p.argv.end(), {"-x", var});
  // (supervise() adds the attempt number and the launch id after this, with their values.)
  p.argv.insert(p.argv.end(), {"-x", "FSDP_LAUNCHED=1"});
  p.argv.push_back(self);
  p.argv.insert(p.argv.end(), rest.begin(), rest.end());
  return p;
}

int supervise(const LaunchPlan& plan, int max_restarts) {
  const std::string launch_id = env::text(train::kLaunchIdVar).value_or(new_launch_id());
  // From here on a stop signal is the launcher's to handle: one that arrived while the front
  // started (blocked since before main) is delivered now, to the handler.
  install_launcher_handlers();
  train::unblock_stop_signals();
  for (int attempt = 0;; ++attempt) {
    // The ranks (on every node) get the attempt number and the launch id through mpirun.
    LaunchPlan run = plan;
    auto at = std::find(run.argv.begin(), run.argv.end(), "FSDP_LAUNCHED=1");
    at = at == run.argv.end() ? at : at + 1;
    run.argv.insert(
        at, {"-x", std::string(train::kRestartAttemptVar) + "=" + std::to_string(attempt), "-x",
             std::string(train::kLaunchIdVar) + "=" + launch_id});
    if (attempt == 0 && g_stop_signal != 0) {
      // Stopped during the launcher's own start-up: nothing ran, nothing to save.
      std::cerr << "fsdp-train: stopped by signal " + std::to_string(g_stop_signal) +
                       " before the job started (exit code 0)\n";
      return 0;
    }
    int err = 0;
    const pid_t pid = start_child(run, &err);
    if (pid < 0) {
      write_error_block("cannot run '" + plan.argv[0] + "': " + std::strerror(err),
                        "install Open MPI (launch/setup.sh) or set FSDP_MPIRUN to mpirun's path");
      return 1;
    }
    const int rc = wait_child(pid);
    if (rc == 0) return 0;
    if (g_stop_signal != 0) {
      std::cerr << "fsdp-train: stopped by signal " << g_stop_signal << " (exit code " << rc
                << "); not restarted\n";
      return rc;
    }
    if (max_restarts == 0) return rc;
    if (rc == 2 || rc == 3) {
      std::cerr << "fsdp-train: exit code " << rc
                << (rc == 2 ? " (a usage or configuration error)"
                            : " (the final checkpoint could not be written)")
                << ": not restarted\n";
      return rc;
    }
    if (attempt >= max_restarts) {
      std::cerr << "fsdp-train: the job failed again (exit code " << rc << ") and all "
                << max_restarts
                << " restart(s) of --max-restarts are used; --resume continues "
                   "from the newest checkpoint\n";
      return rc;
    }
    std::cerr << "fsdp-train: the job failed (exit code " << rc << "); restart " << attempt + 1
              << " of " << max_restarts << " in " << kRestartDelaySeconds
              << " s, from the newest checkpoint of this launch, or as the first attempt "
                 "started when it saved none (launch "
              << launch_id << ")\n";
    if (!pause_unless_stopped(kRestartDelaySeconds)) {
      std::cerr << "fsdp-train: stopped by signal " << g_stop_signal << " before the restart\n";
      return rc;
    }
  }
}

int maybe_relaunch(int& argc, char** argv) {
  LauncherArgs args;
  if (const int rc = parse_launcher_flags(argc, argv, &args); rc != 0) return rc;
  const int nproc = args.nproc, nnodes = args.nnodes, max_restarts = args.max_restarts;
  const std::string& hostfile = args.hostfile;
  if (nproc == 0) {
    if (nnodes != 1 || !hostfile.empty()) {
      return usage_error("--nnodes and --hostfile need --nproc-per-node",
                         "add --nproc-per-node N (ranks per node)");
    }
    if (max_restarts >= 0 && !env::is_set("FSDP_LAUNCHED")) {
      return usage_error(
          "--max-restarts needs --nproc-per-node: fsdp-train's own launcher restarts the job",
          "add --nproc-per-node N; under mpirun or srun, drop --max-restarts and let the "
          "scheduler rerun the job with --resume auto");
    }
    if (max_restarts < 0) return -1;
  }
  if (env::is_set("FSDP_LAUNCHED") || env::is_set("OMPI_COMM_WORLD_SIZE") ||
      env::is_set("PMI_SIZE") || env::is_set("SLURM_STEP_ID")) {
    // Already started by a launcher: run as the rank we are.
    std::cerr << "fsdp-train: --nproc-per-node/--max-restarts ignored: already running under a "
                 "launcher\n";
    // Drop the launcher flags from argv in place; the pointers stay valid (they are argv's).
    int out = 1;
    for (int i : args.rest_index) argv[out++] = argv[i];
    argv[out] = nullptr;
    argc = out;
    return -1;
  }
  if (nnodes > 1 && hostfile.empty()) {
    return usage_error("--nnodes " + std::to_string(nnodes) + " needs --hostfile listing the nodes",
                       "add --hostfile FILE (an Open MPI hostfile, docs/multi-node.md)");
  }
  // All ranks on this node (no hostfile): each needs at least kMinRankMemoryMiB.
  const long long memory = hostfile.empty() ? node_memory_mib() : 0;
  if (memory > 0 && nproc * kMinRankMemoryMiB > memory) {
    return usage_error(
        "--nproc-per-node " + std::to_string(nproc) + ": that many ranks need at least " +
            std::to_string(nproc * kMinRankMemoryMiB >> 10) + " GiB on this node (" +
            std::to_string(kMinRankMemoryMiB) +
            " MiB per rank before any model: LibTorch and MPI), and it has " +
            std::to_string(memory >> 10) + " GiB",
        "start at most " + std::to_string(memory / kMinRankMemoryMiB) +
            " ranks per node here (far fewer for a real model), or spread them over nodes "
            "with --hostfile and --nnodes");
  }
  // Far more ranks than cores only thrashes (each rank gets a sliver of a core and its own copy
  // of the model): allowed, since tests and debugging oversubscribe, but said loudly.
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && nproc > 4 * cores) {
    std::cerr << "fsdp-train: warning: --nproc-per-node " << nproc << " is more than 4x the "
              << cores
              << " cores of this node: every rank gets a fraction of a core, and "
                 "training is much slower than with fewer ranks (one per GPU, or a few on the "
                 "CPU)\n";
  }
  LaunchPlan plan = plan_launch(nproc, nnodes, hostfile, self_path(argv[0]), args.rest);
  if (args.dry_run) {
    for (size_t i = 0; i < plan.argv.size(); ++i) std::cout << (i ? " " : "") << plan.argv[i];
    std::cout << "\n";
    if (max_restarts > 0) std::cout << "(restarted up to " << max_restarts << " time(s))\n";
    return 0;
  }
  return supervise(plan, std::max(max_restarts, 0));
}

}  // namespace fsdp::app
