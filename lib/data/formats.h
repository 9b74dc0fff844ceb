// The feature-format registry: every format fsdp-train reads registers once (data/formats.cpp,
// the one file that knows which formats exist), with its name, how to recognise a path that holds
// it, how to open it and what it adds to the "no feature files" message. Detection
// (open_feature_dataset, dataset.h) and that message iterate the registry, never a hand list.
// Adding a format: its reader file defines its FeatureFormat, plus one row in the registry and
// the CMake source list. The readers' own entry points follow (the tests call them directly).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace fsdp::data {

// When a format's recognition is decided (the registry checks the stages in this order).
enum class FormatDetection {
  kIndexed,    // an index file its writer names: wins over whatever else lies beside it
  kDirectory,  // files directly in the directory: two such formats at once are refused
  kTree,       // searched recursively, only when no format above matched
};

// Opens the dataset a probe recognised (nothing is listed twice).
using FeatureOpener = std::function<std::shared_ptr<FeatureDataset>(const DatasetOptions&)>;

struct FeatureFormat {
  // FeatureDataset::format() of its datasets, as logs, convert's report and the native index's
  // source_format spell it.
  const char* name;
  // What a path of this format holds, as the "no feature files found" message lists it.
  const char* recognised_by;
  FormatDetection detection;
  // Looks at `path` without opening a feature file: how to open it when it holds this format,
  // else an empty opener. Throws UsageError where the path cannot be looked at (kTree: it is
  // not a directory).
  FeatureOpener (*probe)(const std::string& path);
};

// Every registered format, in detection order.
const std::vector<FeatureFormat>& feature_formats();

// The registered format called `name`, or nullptr.
const FeatureFormat* find_feature_format(std::string_view name);

// "PATH: no feature files found (no C, B or A)", A, B, C being every registered format's
// recognised_by in registry order (listed in reverse: the .ckpt tree first).
std::string no_features_message(const std::string& path);

// speculators (data/speculators_format.cpp): `dir` directly holds hs_<i>.safetensors files.
bool is_speculators_dump(const std::string& dir);
std::shared_ptr<FeatureDataset> open_speculators_dataset(const std::string& dir,
                                                         const DatasetOptions& options);

// NVIDIA ModelOpt (data/modelopt_format.cpp): `dir` directly holds *.pt files (and no *.ckpt).
bool is_modelopt_dump(const std::string& dir);
std::shared_ptr<FeatureDataset> open_modelopt_dataset(const std::string& dir,
                                                      const DatasetOptions& options);

// DeepSpec (data/deepspec_format.cpp): `dir` holds manifest.json and samples.idx.
bool is_deepspec_cache(const std::string& dir);
std::shared_ptr<FeatureDataset> open_deepspec_dataset(const std::string& dir,
                                                      const DatasetOptions& options);

}  // namespace fsdp::data
