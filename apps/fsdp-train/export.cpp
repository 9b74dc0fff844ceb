// `fsdp-train export`: a checkpoint's sharded fp32 master weights, reassembled into one
// serving-format draft directory (config.json + model.safetensors) in fp32 or bf16: what
// DeepSpeed users run zero_to_fp32.py for. One process, no MPI, any saved world size; never
// modifies the checkpoint.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export.h"
#include "commands.h"
#include "core/error.h"
#include "shard/engine.h"

namespace fsdp::app {

namespace {

struct ExportFlags {
  std::string checkpoint;
  std::string output;
  std::string dtype = "fp32";
  bool overwrite = false;
};

int run_export(const ExportFlags& f) {
  namespace fs = std::filesystem;
  FSDP_USAGE_CHECK(f.dtype == "fp32" || f.dtype == "bf16",
                   "--dtype '" + f.dtype + "' is not one of fp32, bf16",
                   "use --dtype fp32 or --dtype bf16");
  std::error_code exists_ec;
  FSDP_USAGE_CHECK(fs::is_directory(f.checkpoint, exists_ec),
                   "--checkpoint " + f.checkpoint + " does not exist (or is not a directory)",
                   "point it at an <output-dir>/epoch_<E>_step_<S> directory");
  FSDP_USAGE_CHECK(checkpoint::is_complete(f.checkpoint),
                   "--checkpoint " + f.checkpoint + ": not a complete fsdp-train checkpoint (no " +
                       checkpoint::kCompleteMarker + " marker)",
                   "point it at an <output-dir>/epoch_<E>_step_<S> directory");
  const std::string state_dir = checkpoint::join_path(f.checkpoint, "train_state");
  FSDP_USAGE_CHECK(fs::is_regular_file(state_dir + "/manifest.txt"),
                   "--checkpoint " + f.checkpoint + " has no train_state/manifest.txt",
                   "point --checkpoint at an <output-dir>/epoch_<E>_step_<S> directory");
  std::error_code ec;
  const std::string out = fs::weakly_canonical(f.output, ec).string();
  const std::string ckpt = fs::weakly_canonical(f.checkpoint, ec).string();
  FSDP_USAGE_CHECK(out != ckpt && out.rfind(ckpt + "/", 0) != 0,
                   "--output " + f.output + " is inside the checkpoint " + f.checkpoint,
                   "write the export to a directory outside the checkpoint (it is only read)");
  FSDP_USAGE_CHECK(f.overwrite || !fs::exists(f.output / fs::path("model.safetensors"), ec),
                   "--output " + f.output + " already holds a model.safetensors",
                   "choose another directory or pass --overwrite");
  // The checkpoint's own export supplies the draft config and the vocabulary mapping.
  const checkpoint::DraftExport saved = checkpoint::read_draft_export(f.checkpoint);
  std::ifstream cfg(saved.config_path);
  std::stringstream config_json;
  config_json << cfg.rdbuf();
  const auto weights = shard::consolidate_state(state_dir, /*include_frozen=*/false);
  // Only the tensors of the export (the trainable ones) leave; the frozen embedding does not.
  std::map<std::string, at::Tensor> exported;
  int64_t params = 0;
  for (const auto& [name, w] : saved.weights) {
    auto it = weights.find(name);
    FSDP_CHECK(it != weights.end(), f.checkpoint + ": the training state has no '" + name + "'",
               "the checkpoint is inconsistent; use another one");
    FSDP_CHECK(it->second.sizes() == w.sizes(),
               f.checkpoint + ": '" + name + "' differs in shape between state and export",
               "the checkpoint is inconsistent; use another one");
    exported[name] = it->second;
    params += w.numel();
  }
  const auto bytes =
      checkpoint::write_draft_export(f.output, config_json.str(), exported, saved.d2t, saved.t2d,
                                     f.dtype == "fp32" ? c10::kFloat : c10::kBFloat16);
  std::cout << "export: " << exported.size() << " tensors, " << params << " parameters, " << f.dtype
            << ", " << (bytes >> 20) << " MiB -> " << f.output << "/model.safetensors\n";
  return 0;
}

}  // namespace

void add_export(CLI::App& root, Action* action) {
  auto f = std::make_shared<ExportFlags>();
  CLI::App* sub = root.add_subcommand(
      "export",
      "write a checkpoint's full-precision weights (reassembled from the fp32 master shards of "
      "any number of ranks) as config.json + model.safetensors; DeepSpeed's zero_to_fp32.py");
  sub->add_option("--checkpoint", f->checkpoint, "an <output-dir>/epoch_<E>_step_<S> directory")
      ->required();
  sub->add_option("--output", f->output, "directory for config.json and model.safetensors")
      ->required();
  sub->add_option("--dtype", f->dtype, "fp32 (default: the master weights) or bf16");
  sub->add_flag("--overwrite", f->overwrite, "replace an existing model.safetensors in --output");
  sub->callback([action, f]() {
    action->run = [f]() { return run_export(*f); };
    action->needs_mpi = false;
  });
}

}  // namespace fsdp::app
