// mpirun relaunch (launcher.h).
#include "launcher.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

namespace fsdp::app {

namespace {
bool parse_positive(const char* s, int* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!end || *end != '\0' || v <= 0 || v > 1 << 20) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string self_path(const char* argv0) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, n);
  return argv0;
}

int usage_error(const std::string& msg) {
  std::cerr << "fsdp-train: " << msg << "\nRun 'fsdp-train --help' for usage.\n";
  return 2;
}
}  // namespace

LaunchPlan plan_launch(int nproc_per_node, int nnodes, const std::string& hostfile,
                       const std::string& self, const std::vector<std::string>& rest) {
  LaunchPlan p;
  const char* mpirun = std::getenv("FSDP_MPIRUN");
  p.argv.push_back(mpirun && *mpirun ? mpirun : "mpirun");
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
  // Remote nodes get the variables that matter for us and for NCCL.
  for (const char* var : {"FSDP_LOG_LEVEL", "FSDP_PRETEND_NODES", "NCCL_SOCKET_IFNAME",
                          "NCCL_DEBUG", "NCCL_IB_DISABLE", "LD_LIBRARY_PATH"}) {
    if (std::getenv(var)) p.argv.insert(p.argv.end(), {"-x", var});
  }
  p.argv.insert(p.argv.end(), {"-x", "FSDP_LAUNCHED=1"});
  p.argv.push_back(self);
  p.argv.insert(p.argv.end(), rest.begin(), rest.end());
  return p;
}

int maybe_relaunch(int& argc, char** argv) {
  int nproc = 0, nnodes = 1;
  std::string hostfile;
  bool dry_run = false;
  std::vector<std::string> rest;
  std::vector<int> rest_index;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag, std::string* out) -> bool {
      if (a == flag) {
        if (i + 1 >= argc) return false;
        *out = argv[++i];
        return true;
      }
      if (a.rfind(flag + "=", 0) == 0) {
        *out = a.substr(flag.size() + 1);
        return true;
      }
      return false;
    };
    std::string v;
    if (a == "--nproc-per-node" || a.rfind("--nproc-per-node=", 0) == 0) {
      if (!value("--nproc-per-node", &v)) return usage_error("--nproc-per-node needs a value");
      if (!parse_positive(v.c_str(), &nproc)) {
        return usage_error("--nproc-per-node: '" + v + "' is not a positive integer");
      }
    } else if (a == "--nnodes" || a.rfind("--nnodes=", 0) == 0) {
      if (!value("--nnodes", &v)) return usage_error("--nnodes needs a value");
      if (!parse_positive(v.c_str(), &nnodes)) {
        return usage_error("--nnodes: '" + v + "' is not a positive integer");
      }
    } else if (a == "--hostfile" || a.rfind("--hostfile=", 0) == 0) {
      if (!value("--hostfile", &hostfile)) return usage_error("--hostfile needs a value");
      if (::access(hostfile.c_str(), R_OK) != 0) {
        return usage_error("--hostfile: cannot read '" + hostfile + "'");
      }
    } else if (a == "--launch-dry-run") {
      dry_run = true;
    } else {
      rest.push_back(a);
      rest_index.push_back(i);
    }
  }
  if (nproc == 0) {
    if (nnodes != 1 || !hostfile.empty()) {
      return usage_error("--nnodes and --hostfile need --nproc-per-node");
    }
    return -1;
  }
  if (std::getenv("FSDP_LAUNCHED") || std::getenv("OMPI_COMM_WORLD_SIZE") ||
      std::getenv("PMI_SIZE") || std::getenv("SLURM_STEP_ID")) {
    // Already started by a launcher: run as the rank we are.
    std::cerr << "fsdp-train: --nproc-per-node ignored: already running under a launcher\n";
    // Drop the launcher flags from argv in place; the pointers stay valid (they are argv's).
    int out = 1;
    for (int i : rest_index) argv[out++] = argv[i];
    argv[out] = nullptr;
    argc = out;
    return -1;
  }
  if (nnodes > 1 && hostfile.empty()) {
    return usage_error("--nnodes " + std::to_string(nnodes) + " needs --hostfile listing the nodes");
  }
  LaunchPlan plan = plan_launch(nproc, nnodes, hostfile, self_path(argv[0]), rest);
  if (dry_run) {
    for (size_t i = 0; i < plan.argv.size(); ++i) std::cout << (i ? " " : "") << plan.argv[i];
    std::cout << "\n";
    return 0;
  }
  std::vector<char*> args;
  for (auto& s : plan.argv) args.push_back(s.data());
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::cerr << "fsdp-train: cannot run '" << args[0] << "': " << std::strerror(errno)
            << "\n---> HINT: install Open MPI (launch/setup.sh) or set FSDP_MPIRUN to mpirun's path\n";
  return 1;
}

}  // namespace fsdp::app
