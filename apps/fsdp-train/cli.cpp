// Root command line and exit-code policy (cli.h).
#include "cli.h"

#include <torch/version.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>

#include "comm/runtime.h"
#include "commands.h"
#include "config/options.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "data/dataset.h"
#include "error_block.h"

namespace fsdp::app {

namespace {
int report(const Error& e, int code) {
  write_error_block(e.message() + " [" + e.location() + "]", e.hint());
  return code;
}

// With several ranks, an error most often happens on all of them (a bad flag, a missing file):
// rank 0 reports it and stops the job at once; the other ranks wait a moment first, so that the
// same message is printed once, and report only an error of their own (then rank 0 is waiting
// in a collective and does not stop the job).
void let_rank0_report_first() {
  const auto [rank, size] = comm::mpi_rank_and_size();
  if (size > 1 && rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
}

// Reports `e` and returns `code`; with several ranks, stops the whole job with that code (other
// ranks may be waiting in a collective).
int fail(const Error& e, int code) {
  if (comm::mpi_rank_and_size().second > 1) {
    let_rank0_report_first();
    report(e, code);
    comm::abort_job("stopping all ranks after the error above", code);
  }
  return report(e, code);
}

std::string version_text() {
  std::string s = "fsdp-train 0.1.0 (LibTorch " TORCH_VERSION ", backends:";
  for (const auto& b : comm::compiled_backends()) s += " " + b;
  return s + "; allocator: " + env::allocator_in_use() + ")";
}

const char* const kRootDescription =
    "fsdp-train: train EAGLE3 draft models on precomputed hidden states with a ZeRO-3 sharding "
    "engine.\nTrain: fsdp-train --target-model-path DIR|ORG/NAME [--draft-model-config FILE] "
    "--train-hidden-states-path DIR --output-dir DIR [...] | fsdp-train --config run.yaml\n"
    "Launch: mpirun -np N fsdp-train ... | fsdp-train --nproc-per-node N ... "
    "(--hostfile FILE --nnodes K for several nodes; --max-restarts K restarts a failed job from "
    "its newest checkpoint)";

// Training flags are the root's: its extras get the SpecForge-aware advice. A subcommand's
// extras (the root has none then) get CLI11's message in our format.
int report_extras(CLI::App& app, const CLI::ExtrasError& e) {
  const auto extras = app.remaining();
  if (extras.empty()) {
    write_error_block(e.what(),
                      "drop it, or check its spelling: fsdp-train <subcommand> --help lists "
                      "the subcommand's flags");
    return 2;
  }
  // Values after an unknown flag are its own: report the flags, or else the stray words.
  const bool any_flag = std::any_of(extras.begin(), extras.end(),
                                    [](const std::string& a) { return a.rfind("--", 0) == 0; });
  for (const auto& arg : extras) {
    if (any_flag && arg.rfind("--", 0) != 0) continue;
    const auto advice = config::advise_unknown_flag(arg);
    write_error_block(advice.message, advice.hint);
  }
  return 2;
}

// Every other parse error in our format, with a hint ("--x requires an argument", ...).
int report_parse_error(const CLI::ParseError& e) {
  const std::string what = e.what();
  const bool missing = what.find("requires") != std::string::npos ||
                       what.find("required") != std::string::npos ||
                       what.find("missing") != std::string::npos;
  write_error_block(what, missing ? "give the flag its value (--name VALUE or --name=VALUE); "
                                    "fsdp-train --help lists every flag and its values"
                                  : "check the flag's spelling and value; fsdp-train --help "
                                    "lists every flag and its values");
  return 2;
}

// Parses the command line; returns the exit code when it ends here (an error, --help, --version).
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    log::init_from_env();
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    return report_extras(app, e);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == 0) return app.exit(e);
    return report_parse_error(e);
  } catch (const UsageError& e) {
    return report(e, 2);
  }
  return std::nullopt;
}

// Runs the chosen subcommand, or training when training flags were given.
int run_action(CLI::App& app, Action& action, const TrainCommand& train,
               const std::string& log_level, int& argc, char**& argv) {
  if (!log_level.empty()) log::set_level(log::parse_level(log_level));
  if (!action.run && train.requested()) {
    action.run = train.run;
    action.needs_mpi = true;
  }
  if (!action.run) {
    std::cout << app.help();
    std::cerr << "fsdp-train: nothing to do: give training flags (see above), --config FILE, "
                 "or a subcommand\n";
    return 2;
  }
  if (action.needs_mpi) comm::init(&argc, &argv);
  const int rc = action.run();
  if (action.needs_mpi) comm::finalize();
  return rc;
}

// An exception that is none of ours (LibTorch, MPI, the system): exit code 1.
int report_foreign_error(const std::exception& e) {
  let_rank0_report_first();
  write_error_block(error_text(e),
                    is_out_of_memory(e)
                        ? "out of memory. In this order: --activation-checkpointing, a smaller "
                          "--draft-micro-batch-size (more accumulation) or --max-length, "
                          "--cpu-offload, more ranks with --sharding-strategy full_shard (the "
                          "start-up line 'sharded state per rank' gives the part that does not "
                          "depend on the batch); --resume continues from the newest checkpoint"
                        : "an error from LibTorch, MPI or the system: check what the message "
                          "names; if it is none of these, report it as a bug in fsdp-train");
  if (comm::initialized() && comm::topology().world_size > 1) {
    comm::abort_job("stopping all ranks after the error above", 1);
  }
  return 1;
}
}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{kRootDescription, "fsdp-train"};
  app.set_version_flag("--version", version_text());
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "log level: trace, debug, info, warn, error, off (env FSDP_LOG_LEVEL)");
  Action action;
  add_check_export(app, &action);
  add_comm_bench(app, &action);
  add_convert(app, &action);
  add_export(app, &action);
  add_gen_toy_data(app, &action);
  add_vocab_map(app, &action);
  add_memory_plan(app, &action);
  TrainCommand train = add_train(app);
  app.require_subcommand(0, 1);

  if (const auto rc = parse_command_line(app, argc, argv)) return *rc;
  try {
    return run_action(app, action, train, log_level, argc, argv);
  } catch (const CheckpointWriteError& e) {
    // Every rank meets it (the ranks agree on a failed save).
    return fail(e, 3);
  } catch (const data::SampleReadError& e) {
    // A file that could not be read, even after the retries (storage trouble): a runtime
    // failure (exit code 1, which --max-restarts retries), not a usage error.
    return fail(e, 1);
  } catch (const UsageError& e) {
    return fail(e, 2);
  } catch (const Error& e) {
    return fail(e, 1);
  } catch (const std::exception& e) {
    return report_foreign_error(e);
  }
}

}  // namespace fsdp::app
