// Stop signals, launch attempts and the crash test hook (train/signals.h). Standard C++ and
// POSIX only, never LibTorch: the fsdp-train front executable compiles this file.
#include "train/signals.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

#include "core/env.h"

namespace fsdp::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  // The next SIGINT/SIGTERM takes the default action (terminate) if the save hangs. SIGUSR1 stays
  // a request: the launcher repeats it until the ranks exist (mpirun forwards it only to ranks
  // that have started), and a repeat must not kill a rank in the middle of its save.
  if (sig != SIGUSR1) std::signal(sig, SIG_DFL);
}

// The value, or the table's default when unset or unusable: these variables are set by the
// launcher and the tests, never by hand, so a bad value is not worth stopping for here.
// (env::read gives the row's default for both.)
int64_t env_int(const char* name) {
  return env::read(name).integer.value_or(0);
}
}  // namespace

void install_stop_handlers() {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) std::signal(sig, on_stop_signal);
}

void install_early_stop_request() {
  std::signal(SIGUSR1, on_stop_signal);
}

namespace {
void change_stop_signal_mask(int how) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set, sig);
  ::sigprocmask(how, &set, nullptr);
}
}  // namespace

void block_stop_signals() {
  change_stop_signal_mask(SIG_BLOCK);
}
void unblock_stop_signals() {
  change_stop_signal_mask(SIG_UNBLOCK);
}

bool stop_requested() {
  return g_signal != 0;
}
int stop_signal() {
  return static_cast<int>(g_signal);
}
void reset_stop_request() {
  g_signal = 0;
}

LaunchAttempt launch_attempt() {
  LaunchAttempt a;
  a.attempt = static_cast<int>(env_int(kRestartAttemptVar));
  if (auto id = env::text(kLaunchIdVar)) a.launch_id = *id;
  return a;
}

void maybe_kill_for_test(int64_t step, int rank) {
  const int64_t at = env_int("FSDP_TEST_KILL_AT_STEP");
  if (at < 0 || step != at || rank != env_int("FSDP_TEST_KILL_RANK")) return;
  if (launch_attempt().attempt >= env_int("FSDP_TEST_KILL_ATTEMPTS")) return;
  ::kill(::getpid(), SIGKILL);
}

}  // namespace fsdp::train
