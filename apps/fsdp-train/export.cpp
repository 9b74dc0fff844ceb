// `fsdp-train export`: a checkpoint's sharded fp32 master weights, reassembled into one
// serving-format draft directory (config.json + model.safetensors) in fp32 or bf16: what
// DeepSpeed users run zero_to_fp32.py for. One process, no MPI, any saved world size; never
// modifies the checkpoint.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export.h"
#include "commands.h"
#include "core/error.h"
#include "model/aux_layers.h"
#include "model/draft_model.h"
#include "shard/engine.h"

namespace fsdp::app {

namespace {

struct ExportFlags {
  std::string checkpoint;
  std::string output;
  std::string dtype = "fp32";
  std::string for_engines = "engines";
  std::string rope_scaling;
  std::string aux_convention = "layer-output";
  std::string target_model_path;
  bool overwrite = false;
};

// The target layers of the checkpoint's features: its aux_layers.json when it has one (every
// checkpoint since the file exists); else the saved config's ids, read with --aux-layer-convention
// (a top-level id list is vLLM's and needs none).
std::optional<model::AuxLayers> checkpoint_aux_layers(const ExportFlags& f,
                                                      const std::string& config_json) {
  const std::string record = checkpoint::join_path(f.checkpoint, checkpoint::layout::kAuxLayers);
  const auto convention = model::parse_convention(f.aux_convention);
  FSDP_USAGE_CHECK(convention.has_value(),
                   "--aux-layer-convention '" + f.aux_convention +
                       "' is not one of layer-output, hidden-state-index",
                   "use the convention the draft config's ids were written in");
  if (const auto hs = model::read_aux_layers_record(f.checkpoint)) {
    // The record holds the ids as hidden_states indices under the top-level (vLLM) key's name.
    nlohmann::json as_config = {{"eagle_aux_hidden_state_layer_ids", *hs}};
    return model::resolve_aux_layers(as_config.dump(), *convention, 0, record);
  }
  const int64_t L = f.target_model_path.empty() ? 0 : model::target_num_layers(f.target_model_path);
  return model::resolve_aux_layers(config_json, *convention, L, f.checkpoint + "/config.json");
}

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
  const std::string state_dir =
      checkpoint::join_path(f.checkpoint, checkpoint::layout::kTrainState);
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
  // A LoRA run's state holds the frozen base and the adapters: merged as the run's own export.
  const auto lora = checkpoint::read_lora_record(f.checkpoint);
  auto weights = shard::consolidate_state(state_dir, /*include_frozen=*/lora.has_value());
  if (lora) model::merge_lora(weights, lora->scale());
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
  const auto target = model::parse_export_target(f.for_engines);
  FSDP_USAGE_CHECK(target.has_value(),
                   "--for '" + f.for_engines + "' is not one of engines, vllm, sglang, specforge",
                   "engines writes one config.json that vLLM and SGLang both read right");
  const auto aux = checkpoint_aux_layers(f, config_json.str());
  const std::string serving = model::serving_config_json(
      config_json.str(), aux, *target, model::parse_rope_override(f.rope_scaling, 0));
  const auto bytes =
      checkpoint::write_draft_export(f.output, serving, exported, saved.d2t, saved.t2d,
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
  sub->add_option("--for", f->for_engines,
                  "engines (default: one config.json vLLM and SGLang both read right), vllm, "
                  "sglang or specforge (docs/serving.md)");
  sub->add_option("--rope-scaling", f->rope_scaling,
                  "RoPE scaling to write in both schemas: a JSON object such as "
                  "'{\"rope_type\": \"yarn\", \"factor\": 32, "
                  "\"original_max_position_embeddings\": 2048}'");
  sub->add_option("--aux-layer-convention", f->aux_convention,
                  "for checkpoints without aux_layers.json: what the saved config's "
                  "eagle_config ids mean (layer-output, SpecForge's; or hidden-state-index)");
  sub->add_option("--target-model-path", f->target_model_path,
                  "the target directory, for checking the layer ids against its layer count");
  sub->add_flag("--overwrite", f->overwrite, "replace an existing model.safetensors in --output");
  sub->callback([action, f]() {
    action->run = [f]() { return run_export(*f); };
    action->needs_mpi = false;
  });
}

}  // namespace fsdp::app
