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

// Training is the root command (SpecForge-compatible flags, no subcommand): add_train adds the
// option table's flags to the root app; `requested` tells whether any was given.
struct TrainCommand {
  std::function<int()> run;
  std::function<bool()> requested;
};
TrainCommand add_train(CLI::App& root);

void add_check_export(CLI::App& root, Action* action);
void add_comm_bench(CLI::App& root, Action* action);
void add_convert(CLI::App& root, Action* action);
void add_export(CLI::App& root, Action* action);
void add_gen_toy_data(CLI::App& root, Action* action);
void add_memory_plan(CLI::App& root, Action* action);
void add_vocab_map(CLI::App& root, Action* action);

}  // namespace fsdp::app
