// `fsdp-train --nproc-per-node N ...`: re-executes this binary under mpirun with N ranks per
// node (root and oversubscription handled, --hostfile/--nnodes passed to mpirun, every other
// argument passed through). Started by mpirun/srun or alone, nothing is relaunched.
#pragma once

#include <string>
#include <vector>

namespace fsdp::app {

// Returns -1 when no relaunch was requested, else the exit code to return (2 for bad flags;
// on success this function does not return: the process becomes mpirun). When already under a
// launcher, the launcher flags are removed from argc/argv and -1 is returned.
int maybe_relaunch(int& argc, char** argv);

// The mpirun command line the launcher would run (exposed for tests and --dry-run).
struct LaunchPlan {
  std::vector<std::string> argv;
};
LaunchPlan plan_launch(int nproc_per_node, int nnodes, const std::string& hostfile,
                       const std::string& self, const std::vector<std::string>& rest);

}  // namespace fsdp::app
