// fsdp-train-core entry point: the program the fsdp-train front (front_main.cpp) execs, with
// the stop signals blocked; parses and runs a subcommand. Never run the launcher here.
#include <sys/stat.h>

#include "cli.h"
#include "train/signals.h"

int main(int argc, char** argv) {
  // Everything the trainer writes (checkpoints, metrics, run_config.yaml, logs) is at most
  // rw-r----- / rwxr-x---, whatever the caller's umask: its bits are kept and 027 is added
  // (docs/security.md). The front did it already; repeated for a core started directly.
  ::umask(::umask(0) | 027);
  // A rank may be asked to stop (SIGUSR1 from the launcher, through mpirun) before it has set
  // anything up: keep the request instead of dying. Only then unblock the stop signals the
  // front blocked: one that arrived while LibTorch loaded is delivered now (SIGUSR1 to the
  // handler; SIGINT/SIGTERM/SIGHUP end a process that is not training yet, as they always do).
  fsdp::train::install_early_stop_request();
  fsdp::train::unblock_stop_signals();
  return fsdp::app::run_cli(argc, argv);
}
