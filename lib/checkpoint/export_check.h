// `fsdp-train check-export`: what a serving engine needs from a draft directory (ours or
// another trainer's), checked without loading the weights: config.json, the safetensors headers,
// d2t and t2d, and the aux-layer ids as vLLM 0.32 and SGLang read them (docs/usage.md "Checking
// an export"); an EAGLE3 draft, or a block draft (DFlash, DSpark: the config's architectures
// choose, checkpoint/block_draft_contract.h). Reads only headers and the two mapping tensors; never
// throws for a bad directory (every problem is a finding), never writes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/aux_layers.h"

namespace fsdp::checkpoint {

// One line of the report. `subject` names what the finding is about, exactly as it is spelled in
// the directory: a tensor ("lm_head.weight"), a config key ("config.json:draft_vocab_size") or a
// file ("model.safetensors"); tests match on it.
struct ExportFinding {
  enum class Level { kOk, kWarn, kError };
  Level level = Level::kOk;
  std::string subject;
  std::string message;
  std::string hint;  // what to do; empty for OK
};

struct ExportCheckOptions {
  // The engines that must read the draft right: kEngines (vLLM and SGLang), kVllm or kSglang.
  // ERROR when the named engines disagree or one of them cannot load it; an engine not named
  // that would read it differently is a WARN.
  model::ExportTarget engines = model::ExportTarget::kEngines;
  // The export's check on itself: the engines follow from the aux-id keys the config holds
  // (top-level and eagle_config: both when they name the same layers, else vLLM; top-level only:
  // vLLM; eagle_config only: SGLang, the SpecForge layout; none: both; num_aux_hidden_states
  // other than 3: vLLM, as SGLang cannot build such a draft). Overrides `engines`.
  bool engines_from_config = false;
  // Decoder layers of the target (num_hidden_layers); 0: unknown, the aux-id range is not checked.
  int64_t target_num_layers = 0;
  // The target's vocab_size and hidden_size (block drafts share its embedding and LM head); 0:
  // unknown, not compared.
  int64_t target_vocab_size = 0;
  int64_t target_hidden_size = 0;
};

// Every finding for the draft directory `dir`, in a fixed order (files, config, tensors, vocabulary
// mapping, aux ids, config fields). Reads model.safetensors, or model-*.safetensors shards through
// model.safetensors.index.json; pickled weights (pytorch_model*.bin, *.pt) are refused as an
// ERROR. Only the safetensors headers and d2t/t2d are read: the cost does not grow with the
// weights (a few ms for any draft).
std::vector<ExportFinding> check_export(const std::string& dir, const ExportCheckOptions& options);

bool has_errors(const std::vector<ExportFinding>& findings);
const char* level_name(ExportFinding::Level level);  // "OK", "WARN", "ERROR"
// "ERROR lm_head.weight: message ---> HINT: hint" (OK lines have no hint); one line.
std::string finding_line(const ExportFinding& finding);

// The export's check on itself (checkpoint::write_draft_export runs it before a checkpoint can be
// marked complete): check_export with engines_from_config; throws fsdp::Error listing every
// ERROR finding, so the save fails.
void verify_export(const std::string& dir);

// A target model's decoder-layer count: num_hidden_layers of `target_dir`/config.json, or of its
// text_config (multimodal targets). Throws fsdp::UsageError naming --target-model-path.
int64_t target_num_hidden_layers(const std::string& target_dir);

// What check-export compares a draft with: the target's num_hidden_layers (required, as above),
// vocab_size and hidden_size (0 when its config.json lacks them), from the top level or
// text_config.
struct TargetFacts {
  int64_t num_layers = 0, vocab_size = 0, hidden_size = 0;
};
TargetFacts read_target_facts(const std::string& target_dir);

}  // namespace fsdp::checkpoint
