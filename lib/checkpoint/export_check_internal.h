// Shared pieces of the export check (export_check.cpp: files and tensors; export_check_config.cpp:
// aux ids and config fields). Internal to lib/checkpoint: not part of its interface.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/export_check.h"
#include "checkpoint/serving_contract.h"

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

}  // namespace fsdp::checkpoint::export_check
