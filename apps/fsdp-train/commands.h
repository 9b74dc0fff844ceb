// Subcommand registration: each subcommand adds its CLI11 subcommand and options to the root
// app and sets `action` when selected. cli.cpp owns MPI start-up and error-to-exit-code mapping.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace fsdp::app {

struct Action {
  std::function<int()> run;
  bool needs_mpi = true;
};

void add_comm_bench(CLI::App& root, Action* action);

}  // namespace fsdp::app
