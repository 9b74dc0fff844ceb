// `fsdp-train check-export DIR`: what vLLM and SGLang need from a draft directory (EAGLE3, DFlash
// or DSpark; ours or another trainer's), one line per finding (lib/checkpoint/export_check.h). Exit
// 0 without ERROR, 1 with one, 2 for bad flags. One process, no MPI; reads headers only, writes
// nothing.
#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "checkpoint/export_check.h"
#include "commands.h"
#include "core/error.h"
#include "error_block.h"
#include "model/aux_layers.h"

namespace fsdp::app {

namespace {

struct CheckExportFlags {
  std::string dir;
  std::string engines = "engines";
  std::string target_model_path;
};

int run_check_export(const CheckExportFlags& f) {
  const auto target = model::parse_export_target(f.engines);
  FSDP_USAGE_CHECK(target && *target != model::ExportTarget::kSpecForge,
                   "--for '" + f.engines + "' is not one of engines, vllm, sglang",
                   "use --for engines (vLLM and SGLang), --for vllm or --for sglang");
  std::error_code ec;
  FSDP_USAGE_CHECK(std::filesystem::is_directory(f.dir, ec),
                   "check-export: '" + f.dir + "' is not a directory",
                   "give a draft directory (config.json + model.safetensors), e.g. an "
                   "<output-dir>/epoch_<E>_step_<S> checkpoint");
  checkpoint::ExportCheckOptions o;
  o.engines = *target;
  if (!f.target_model_path.empty()) {
    const auto t = checkpoint::read_target_facts(f.target_model_path);
    o.target_num_layers = t.num_layers;
    o.target_vocab_size = t.vocab_size;
    o.target_hidden_size = t.hidden_size;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto findings = checkpoint::check_export(f.dir, o);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  int counts[3] = {0, 0, 0};
  for (const auto& x : findings) {
    std::cout << checkpoint::finding_line(x) << "\n";
    ++counts[static_cast<int>(x.level)];
  }
  const char* who = *target == model::ExportTarget::kVllm     ? "vLLM"
                    : *target == model::ExportTarget::kSglang ? "SGLang"
                                                              : "vLLM and SGLang";
  std::cout << "check-export: " << f.dir << " for " << who << ": " << counts[0] << " OK, "
            << counts[1] << " WARN, " << counts[2] << " ERROR (checked in " << std::fixed
            << std::setprecision(1) << ms << " ms)\n";
  if (counts[2] == 0) return 0;
  write_error_block(str(f.dir, ": ", counts[2], " ERROR finding(s) above: ", who,
                        " would refuse the draft or serve it wrong"),
                    "fix each ERROR line as its HINT says, then run check-export again");
  return 1;
}

}  // namespace

void add_check_export(CLI::App& root, Action* action) {
  auto f = std::make_shared<CheckExportFlags>();
  CLI::App* sub = root.add_subcommand(
      "check-export",
      "check a draft directory (EAGLE3, DFlash or DSpark; ours or another trainer's) for what "
      "vLLM and SGLang need: tensors, shapes, dtypes, d2t/t2d, target-layer ids, mask token, "
      "config fields; exit 1 on an ERROR");
  sub->add_option("dir", f->dir, "the draft directory (config.json + model.safetensors)")
      ->required();
  sub->add_option("--for", f->engines,
                  "engines (default: vLLM and SGLang must read it alike), vllm or sglang");
  sub->add_option("--target-model-path", f->target_model_path,
                  "the target model's directory: its num_hidden_layers bounds the target-layer "
                  "ids, its vocab_size and hidden_size are a block draft's");
  sub->callback([action, f]() {
    action->run = [f]() { return run_check_export(*f); };
    action->needs_mpi = false;
  });
}

}  // namespace fsdp::app
