// `fsdp-train --nproc-per-node N ...`: runs this binary under mpirun with N ranks per node (root
// and oversubscription handled, --hostfile/--nnodes passed to mpirun, every other argument
// passed through) and supervises it: a stop signal to the launcher becomes a clean stop of every
// rank (checkpoint, exit 0), and with --max-restarts K a failed job is started again up to K
// times, resuming from the newest checkpoint it saved. Started by mpirun/srun or alone, nothing
// is relaunched.
#pragma once

#include <string>
#include <vector>

namespace fsdp::app {

// Called by the front (front_main.cpp) with the stop signals blocked. Returns -1 when no
// relaunch was requested, else the exit code to return (2 for bad flags; otherwise the job's).
// When already under a launcher, the launcher flags are removed from argc/argv and -1 is
// returned. The flags are parsed from one table (name, bounds, hint) in launcher.cpp.
int maybe_relaunch(int& argc, char** argv);

// The mpirun command line the launcher runs (exposed for tests and --launch-dry-run).
struct LaunchPlan {
  std::vector<std::string> argv;
};
LaunchPlan plan_launch(int nproc_per_node, int nnodes, const std::string& hostfile,
                       const std::string& self, const std::vector<std::string>& rest);

// Runs the plan; after a failure (exit code other than 0, 2 and 3, or a rank killed) starts it
// again, up to max_restarts times, kRestartDelaySeconds later. Each start gets the attempt
// number and one launch id in the environment (train/signals.h), from which the trainer
// resumes the newest checkpoint of this launch. Returns the last exit code. Installs the
// launcher's signal handlers, then unblocks the stop signals: a stop that arrived earlier is
// handled then, and one that arrived before mpirun was started ends the launch with exit code
// 0 without starting it.
int supervise(const LaunchPlan& plan, int max_restarts);
inline constexpr int kRestartDelaySeconds = 5;

}  // namespace fsdp::app
