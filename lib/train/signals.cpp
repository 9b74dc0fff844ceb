// Stop-signal flag (train/signals.h).
#include "train/signals.h"

#include <csignal>

namespace fsdp::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  // The next identical signal takes the default action (terminate) if the save hangs.
  std::signal(sig, SIG_DFL);
}
}  // namespace

void install_stop_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return static_cast<int>(g_signal); }
void reset_stop_request() { g_signal = 0; }

}  // namespace fsdp::train
