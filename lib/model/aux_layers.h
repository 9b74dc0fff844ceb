// Which target hidden states the draft's fc reads, and how each producer and serving engine
// numbers them (docs/serving.md "Target layers"). Torch-free; the one place that knows the
// conventions, so the trainer, `export` and `check-export` cannot disagree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::model {

// The common index everything is converted to: Hugging Face's output_hidden_states index k, the
// residual stream after k decoder layers (0 = the embedding output). vLLM and SGLang capture
// hidden + residual, which is that same tensor for k < L; for k = L they capture it before the
// target's final norm (HF applies the norm to hidden_states[L]).
enum class AuxIdConvention {
  // SpecForge, ModelOpt and SGLang configs: id i is the output of decoder layer i, i.e.
  // hidden_states[i + 1]. SpecForge's default is [1, L/2 - 1, L - 4].
  kLayerOutput,
  // vLLM and speculators: id k is hidden_states[k], the input of decoder layer k. vLLM's default
  // is (2, L/2, L - 3): the same tensors as SpecForge's default.
  kHiddenStateIndex,
};

const char* convention_name(AuxIdConvention c);  // "layer-output" / "hidden-state-index"
// Parses "layer-output" or "hidden-state-index"; nullopt otherwise.
std::optional<AuxIdConvention> parse_convention(const std::string& text);

std::vector<int64_t> to_hidden_state_index(const std::vector<int64_t>& ids, AuxIdConvention c);
std::vector<int64_t> from_hidden_state_index(const std::vector<int64_t>& hs, AuxIdConvention c);

// SpecForge's default capture for a target of L layers, as hidden_states indices.
std::vector<int64_t> default_hidden_state_index(int64_t num_target_layers);

// The target layers a draft's features hold.
struct AuxLayers {
  std::vector<int64_t> hidden_state_index;  // strictly ascending, the order fc reads them in
  std::string origin;                       // where they came from, for messages and metadata
};

// Resolves the draft config's ids. `config_json` is the draft config text; `convention` the
// meaning of eagle_config.eagle_aux_hidden_state_layer_ids (a top-level
// eagle_aux_hidden_state_layer_ids is vLLM's key and always read as hidden_states indices);
// `num_target_layers` 0 when unknown. Without ids, SpecForge's default for the target (needs the
// layer count, and at least 7 layers for three distinct ones; else nullopt: the engines then fall
// back to their own default, the same tensors).
// Throws fsdp::UsageError naming `source` for ids that are not strictly ascending, negative, out
// of range for the target, or top-level and eagle_config ids that name different tensors.
std::optional<AuxLayers> resolve_aux_layers(const std::string& config_json,
                                            AuxIdConvention convention, int64_t num_target_layers,
                                            const std::string& source);

// num_hidden_layers of the target's config.json (top level, else text_config); 0 when the file
// or the key is missing (HF repository ids resolve to a directory before this is called).
int64_t target_num_layers(const std::string& model_dir);

// The record a checkpoint keeps of its features' layers (aux_layers.json): hidden_states
// indices, each engine's ids and where they came from.
std::string aux_layers_record(const AuxLayers& aux);
// The hidden_states indices of `dir`/aux_layers.json (what aux_layers_record wrote); nullopt
// when the file is absent. Throws UsageError naming the file when it is not such a record.
std::optional<std::vector<int64_t>> read_aux_layers_record(const std::string& dir);

// What the engines read from a draft config.json (mirrors their loaders; docs/serving.md):
// vLLM 0.32: top-level eagle_aux_hidden_state_layer_ids, else eagle_config's, as hidden_states
// indices (sorted, duplicates dropped). SGLang: eagle_config's only; since its PR #25454 it adds
// one when the first id is 1 (layer-output convention) and takes the ids as they are otherwise;
// before it (`legacy`), it always added one. nullopt: the engine uses its default capture.
std::optional<std::vector<int64_t>> vllm_reads(const std::string& config_json);
std::optional<std::vector<int64_t>> sglang_reads(const std::string& config_json, bool legacy);

// The ids to write for SGLang so that every SGLang version reads `hs` when possible: the
// layer-output form when hs[0] == 2 (read right before and after PR #25454); the hs indices
// themselves when hs[0] is 0 or >= 3 (right since PR #25454 only); nullopt when hs[0] == 1, which
// no SGLang reading can express.
std::optional<std::vector<int64_t>> sglang_ids(const std::vector<int64_t>& hs);

// The engines a config.json is written for (`--export-for`, `export --for`).
enum class ExportTarget { kEngines, kVllm, kSglang, kSpecForge };
const char* export_target_name(ExportTarget t);
std::optional<ExportTarget> parse_export_target(const std::string& text);

// RoPE injected into an export (`--export-rope-scaling`): a JSON object in transformers v4's
// rope_scaling schema (rope_type or type, factor, ...) or the shorthand "yarn:<factor>" (original
// length = the training --max-length). Empty = none.
struct RopeOverride {
  std::string rope_scaling_json;  // validated JSON object, "" for none
};
// Parses `text`; `train_length` supplies original_max_position_embeddings for the shorthand.
// Throws UsageError naming --export-rope-scaling.
RopeOverride parse_rope_override(const std::string& text, int64_t train_length);

// Rewrites a draft config.json (text in, text out) for `target`: aux ids in each engine's
// convention (top-level for vLLM, eagle_config for SGLang; kSpecForge: eagle_config only, in the
// layer-output convention), rope_theta + rope_scaling (transformers v4 readers) and
// rope_parameters (v5 readers) written consistently, the RoPE override applied to both, and
// max_position_embeddings raised to factor x original length when a scaling extends it. Throws
// UsageError when `target` cannot express `aux` (SGLang and hs[0] == 1).
std::string serving_config_json(const std::string& config_json, const std::optional<AuxLayers>& aux,
                                ExportTarget target, const RopeOverride& rope = {});

}  // namespace fsdp::model
