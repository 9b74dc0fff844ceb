// The training command: SpecForge-style root-level flags (`fsdp-train --target-model-path ...`)
// or `fsdp-train --config run.yaml`, resolved through the option table, then the Trainer.
#include <CLI/CLI.hpp>

#include <iostream>

#include "comm/runtime.h"
#include "commands.h"
#include "compat/resolve.h"
#include "config/options.h"
#include "core/log.h"
#include "train/signals.h"
#include "train/trainer.h"

namespace fsdp::app {

namespace {
int run_training(const config::CommandLineValues& values) {
  // From the start: a stop signal during set-up (data checks, the vocabulary pass) is a stop
  // request too, not the end of the process (SIGUSR1's default action).
  train::install_stop_handlers();
  config::ResolveOptions ro;
  ro.world_size = comm::topology().world_size;
  std::vector<std::string> report;
  ro.report = &report;
  config::TrainConfig cfg = config::resolve(values, ro);
  if (comm::topology().world_rank == 0) {
    for (const auto& line : report) std::cerr << line << "\n";
  }
  if (cfg.runtime.log_level != log::Level::kInfo) log::set_level(cfg.runtime.log_level);
  train::Trainer trainer(std::move(cfg));
  auto result = trainer.run();
  if (comm::topology().world_rank == 0 && !result.last_checkpoint.empty()) {
    std::cout << "checkpoint: " << result.last_checkpoint << "\n";
  }
  return 0;
}
}  // namespace

TrainCommand add_train(CLI::App& root) {
  auto binding = std::make_shared<config::TrainOptionsBinding>();
  config::add_train_options(root, binding.get());
  TrainCommand t;
  t.requested = [binding]() {
    auto v = binding->values();
    return !v.given.empty() || !v.config_file.empty() || !v.overrides.empty();
  };
  t.run = [binding]() { return run_training(binding->values()); };
  return t;
}

}  // namespace fsdp::app
