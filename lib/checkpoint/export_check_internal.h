// Shared pieces of the export check (export_check.cpp: files and tensors; export_check_config.cpp:
// aux ids and config fields). Internal to lib/checkpoint: not part of its interface.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/export_check.h"
#include "checkpoint/serving_contract.h"

namespace fsdp::checkpoint {
class SafetensorsFile;  // checkpoint/safetensors.h (kept out: this header stays torch-free)
struct TensorInfo;
}  // namespace fsdp::checkpoint

namespace fsdp::checkpoint::export_check {

// Collects findings in order.
struct Report {
  std::vector<ExportFinding> out;
  void add(ExportFinding::Level l, std::string subject, std::string message, std::string hint) {
    out.push_back({l, std::move(subject), std::move(message), std::move(hint)});
  }
  void ok(std::string s, std::string m) {
    add(ExportFinding::Level::kOk, std::move(s), std::move(m), "");
  }
  void warn(std::string s, std::string m, std::string h) {
    add(ExportFinding::Level::kWarn, std::move(s), std::move(m), std::move(h));
  }
  void error(std::string s, std::string m, std::string h) {
    add(ExportFinding::Level::kError, std::move(s), std::move(m), std::move(h));
  }
};

// One tensor of the directory: its file (kept open) and header entry.
struct StoredTensor {
  std::shared_ptr<SafetensorsFile> file;
  const TensorInfo* info = nullptr;
  std::string name;  // as stored
};
// The weights of `dir`: model.safetensors, or the shards of model.safetensors.index.json, by
// stored name; an ERROR for a missing, pickled or corrupt file.
std::map<std::string, StoredTensor> open_weights(const std::filesystem::path& dir, Report& r);

// The engines that must read the draft right (ExportCheckOptions; the rules are
// checkpoint/serving_contract.h's).
using Engines = ServingEngines;
Engines engines_for(const nlohmann::json& cfg, const ExportCheckOptions& options);

std::string list_text(const std::vector<int64_t>& v);
// An exception's message without location or hint.
std::string what_of(const std::exception& e);

// A JSON file (at most 64 MiB); nullopt and an ERROR naming `subject` when missing or invalid.
// `text` receives the file's text.
std::optional<nlohmann::json> read_json(const std::filesystem::path& path,
                                        const std::string& subject, Report& r, std::string* text);
// cfg[key] as a positive integer; nullopt when absent or null, and an ERROR when it is something
// else.
std::optional<int64_t> positive_int(const nlohmann::json& cfg, const std::string& key, Report& r);
// The number of aux layers the config names (top-level ids, else eagle_config's, else 3).
int64_t config_aux_count(const nlohmann::json& cfg);
// Aux ids as each engine reads them; `fc_layers` is fc.weight's input / target_hidden_size.
void check_aux(const std::string& config_text, const nlohmann::json& cfg, const Engines& e,
               int64_t target_layers, std::optional<int64_t> fc_layers, Report& r);
// architectures, draft_vocab_size, tie_word_embeddings, RoPE in both schemas, torch_dtype.
void check_config_fields(const nlohmann::json& cfg, const Engines& e,
                         std::optional<int64_t> lm_head_rows, Report& r);
// RoPE: rope_theta + rope_scaling (transformers v4 readers) against rope_parameters (v5).
void check_rope(const nlohmann::json& cfg, Report& r);

// A DFlash or DSpark draft (checkpoint/block_draft_contract.h), after the config and the weights
// were read: every finding of export_check_block.cpp.
void check_block_draft(const std::filesystem::path& dir, const nlohmann::json& cfg,
                       const std::map<std::string, StoredTensor>& tensors,
                       const ExportCheckOptions& options, Report& r);

}  // namespace fsdp::checkpoint::export_check
