// Process-level control of a training run. Stop signals (SIGTERM, SIGINT, SIGUSR1): the handler
// only sets a flag; the loop checks it after each optimizer step (agreeing across ranks), saves
// a checkpoint and exits cleanly. A second signal while the save runs is left to the default
// action (the user insists). SIGUSR1 is what fsdp-train's launcher sends through mpirun (which
// forwards it to every rank, where SIGTERM to mpirun would kill the ranks), and what schedulers
// send ahead of a preemption (Slurm's --signal=USR1@...).
// Restarts: the launcher (apps/fsdp-train/launcher.h) numbers its starts of one job and gives
// them one launch id through the environment; a restarted attempt resumes from the newest
// checkpoint that this launch saved. Standard C++ and POSIX only: the thin `fsdp-train` front
// executable (apps/fsdp-train/front_main.cpp), which must not load LibTorch, compiles signals.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::train {

// Installs the handlers (idempotent).
void install_stop_handlers();
// Only SIGUSR1, from the first line of main in every process that may become a rank: a stop
// request that arrives during start-up (before MPI_Init even) is kept, not fatal.
void install_early_stop_request();
// SIGINT, SIGTERM, SIGHUP and SIGUSR1: the signals that ask a run or the launcher to stop.
// The front blocks them first thing in main and keeps them blocked across its exec of
// fsdp-train-core (a signal mask survives exec); the core installs its handlers and then
// unblocks them, so a signal that arrives while LibTorch loads is delivered then, not fatal.
void block_stop_signals();
void unblock_stop_signals();
// True once a stop signal arrived.
bool stop_requested();
// The signal number that requested the stop (0 when none).
int stop_signal();
// Clears the flag (tests).
void reset_stop_request();

inline constexpr const char* kRestartAttemptVar = "FSDP_RESTART_ATTEMPT";
inline constexpr const char* kLaunchIdVar = "FSDP_LAUNCH_ID";

struct LaunchAttempt {
  int attempt = 0;        // 0: the first start; k: the k-th restart
  std::string launch_id;  // shared by the starts of one launch; empty without the launcher
};
// Read from the environment. A malformed attempt number counts as 0.
LaunchAttempt launch_attempt();

// Test hook (tests/e2e/restart.sh): FSDP_TEST_KILL_AT_STEP=N makes rank FSDP_TEST_KILL_RANK
// (default 0) kill itself with SIGKILL after optimizer step N, while the attempt number is
// below FSDP_TEST_KILL_ATTEMPTS (default 1): a crash the launcher must recover from.
void maybe_kill_for_test(int64_t step, int rank);

}  // namespace fsdp::train
