// The consolidated draft export of docs/reference.md §7: config.json (the draft config) and
// model.safetensors (every tensor of docs/reference.md §3 except embed_tokens, bf16, plus d2t int64
// and t2d bool), loadable by a serving engine and the safetensors library. Also the reader used
// by --init-checkpoint and --eval-only. Rank 0 only; never writes training state.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::checkpoint {

// Writes `dir`/config.json (config_json verbatim) and `dir`/model.safetensors from full tensors
// by name (any float dtype: stored as `dtype`, bf16 by default as docs/reference.md §7 says;
// "embed_tokens.weight" is left out unless with_embedding: a draft that trains its embedding),
// with d2t and t2d. Tensor order: sorted by name. Returns the bytes of model.safetensors.
uint64_t write_draft_export(const std::string& dir, const std::string& config_json,
                            const std::map<std::string, at::Tensor>& full_state,
                            const at::Tensor& d2t, const at::Tensor& t2d,
                            c10::ScalarType dtype = c10::kBFloat16, bool with_embedding = false);

// A block draft's export (DFlash, DSpark: checkpoint/block_draft_contract.h): `dir`/config.json
// (`config`, from block_draft_export_config) and model.safetensors with exactly the tensors of
// block_draft_layout(config), taken by name from `full_state` and stored as `dtype`; anything
// else in `full_state` (the target's frozen embedding and LM head a model may hold) is not the
// draft's and is left out. Then the export's check on itself (verify_export). Throws fsdp::Error
// when a layout tensor is missing or misshapen (a bug) or the check fails. Returns the bytes of
// model.safetensors.
uint64_t write_block_draft_export(const std::string& dir, const nlohmann::json& config,
                                  const std::map<std::string, at::Tensor>& full_state,
                                  c10::ScalarType dtype = c10::kBFloat16);

struct DraftExport {
  std::map<std::string, at::Tensor> weights;  // trainable tensors as stored (bf16)
  at::Tensor d2t;                             // int64 [Vd], undefined when absent
  at::Tensor t2d;                             // bool [V], undefined when absent
  std::string config_path;
};
// Reads an export directory (model.safetensors + config.json). Throws UsageError naming the
// directory when a file is missing or corrupt.
DraftExport read_draft_export(const std::string& dir);
// Only d2t and t2d of an export (what its lm_head rows mean), without reading the weights.
// Undefined tensors when the file has none; throws UsageError like read_draft_export.
std::pair<at::Tensor, at::Tensor> read_export_mapping(const std::string& dir);

// How a LoRA run adapted its base (docs/model.md "LoRA"), kept as <checkpoint>/lora.json so
// `fsdp-train export` can merge the adapters of the training state again.
struct LoraRecord {
  int64_t rank = 0;
  double alpha = 0.0;
  std::vector<std::string> targets;
  std::string base;  // the --init-checkpoint directory
  double scale() const { return alpha / static_cast<double>(rank); }
};
std::string lora_record_json(const LoraRecord& r);
// Reads <dir>/lora.json; nullopt when the checkpoint is not a LoRA run. Throws UsageError
// naming the file when it is malformed.
std::optional<LoraRecord> read_lora_record(const std::string& dir);

// Writes the adapters alone in PEFT's layout: <dir>/adapter_model.safetensors with tensors
// "base_model.model.<module>.lora_{A,B}.weight" (`adapters` holds "<module>.lora_{A,B}.weight")
// and <dir>/adapter_config.json (peft_type LORA, r, lora_alpha, target_modules, ...).
void write_peft_adapter(const std::string& dir, const std::map<std::string, at::Tensor>& adapters,
                        const LoraRecord& r, c10::ScalarType dtype);

// The export inside a checkpoint (rank 0 of a save; file names: checkpoint_dir.h's layout). A LoRA
// run writes its PEFT adapters (when asked) and lora.json, and merges the adapters into
// `full_state` first (docs/model.md "LoRA"); then config.json and model.safetensors
// (write_draft_export, checked for the engines), then aux_layers.json when the features' layers
// are known (its text from model::aux_layers_record). Throws on any write error.
struct CheckpointExport {
  std::string config_json;  // the draft's config.json as exported
  at::Tensor d2t, t2d;      // the vocabulary mapping
  c10::ScalarType dtype = c10::kBFloat16;
  std::optional<LoraRecord> lora;  // a LoRA run
  bool lora_adapters = false;      // also write <dir>/adapter (--export-lora-adapters)
  std::string aux_layers_record;   // "" when the features' layers are unknown
  // A block draft (DFlash, DSpark): config_json is block_draft_export_config's, the weights are
  // written by write_block_draft_export (no vocabulary mapping, no LoRA).
  bool block_draft = false;
  // The exported name of each state tensor, when it differs from the engine's (P-EAGLE's
  // mask_hidden.weight is SpecForge's and vLLM's mask_hidden); unset: the names as they are.
  std::function<std::string(const std::string&)> rename;
  // The draft trains its embedding (P-EAGLE): embed_tokens.weight is exported (the engines then
  // load it instead of sharing the target's).
  bool trained_embedding = false;
};
void write_checkpoint_export(const std::string& dir, std::map<std::string, at::Tensor>& full_state,
                             const CheckpointExport& e);

}  // namespace fsdp::checkpoint
