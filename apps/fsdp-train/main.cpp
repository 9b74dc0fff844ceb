// fsdp-train entry point: relaunch under mpirun when asked, then parse and run a subcommand.
#include "cli.h"
#include "launcher.h"
#include "train/signals.h"

int main(int argc, char** argv) {
  // A rank may be asked to stop (SIGUSR1 from the launcher, through mpirun) before it has set
  // anything up: keep the request instead of dying. The launcher installs its own handlers.
  fsdp::train::install_early_stop_request();
  if (int rc = fsdp::app::maybe_relaunch(argc, argv); rc >= 0) return rc;
  return fsdp::app::run_cli(argc, argv);
}
