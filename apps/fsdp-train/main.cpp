// fsdp-train entry point: relaunch under mpirun when asked, then parse and run a subcommand.
#include <sys/stat.h>

#include "cli.h"
#include "launcher.h"
#include "train/signals.h"

int main(int argc, char** argv) {
  // Everything the trainer writes (checkpoints, metrics, run_config.yaml, logs, the ranks the
  // launcher starts) is at most rw-r----- / rwxr-x---, whatever the caller's umask: its bits
  // are kept and 027 is added (docs/security.md).
  ::umask(::umask(0) | 027);
  // A rank may be asked to stop (SIGUSR1 from the launcher, through mpirun) before it has set
  // anything up: keep the request instead of dying. The launcher installs its own handlers.
  fsdp::train::install_early_stop_request();
  if (int rc = fsdp::app::maybe_relaunch(argc, argv); rc >= 0) return rc;
  return fsdp::app::run_cli(argc, argv);
}
