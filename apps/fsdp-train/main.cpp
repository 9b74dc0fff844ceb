// fsdp-train entry point: relaunch under mpirun when asked, then parse and run a subcommand.
#include "cli.h"
#include "launcher.h"

int main(int argc, char** argv) {
  if (int rc = fsdp::app::maybe_relaunch(argc, argv); rc >= 0) return rc;
  return fsdp::app::run_cli(argc, argv);
}
