// The command line of fsdp-train: subcommands, exit codes (0 ok, 1 runtime failure, 2 bad
// flags or inputs), and MPI start-up/shutdown around each subcommand.
#pragma once

namespace fsdp::app {

int run_cli(int argc, char** argv);

}  // namespace fsdp::app
