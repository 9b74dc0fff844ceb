// The feature-format registry (formats.h) and detection over it: each stage's formats are probed
// in registry order; a stage where two formats recognise the path refuses it rather than guess.
#include "data/formats.h"

#include <filesystem>
#include <utility>

#include "core/error.h"

namespace fsdp::data {

// Each format's entry, defined in its reader's file. Declared here only: the registry is the one
// place that asks for them.
FeatureFormat native_feature_format();       // native_reader.cpp
FeatureFormat deepspec_feature_format();     // deepspec_format.cpp
FeatureFormat speculators_feature_format();  // speculators_format.cpp
FeatureFormat modelopt_feature_format();     // modelopt_format.cpp
FeatureFormat ckpt_feature_format();         // ckpt_format.cpp

const std::vector<FeatureFormat>& feature_formats() {
  static const std::vector<FeatureFormat> formats = {
      native_feature_format(),      deepspec_feature_format(), modelopt_feature_format(),
      speculators_feature_format(), ckpt_feature_format(),
  };
  return formats;
}

const FeatureFormat* find_feature_format(std::string_view name) {
  for (const auto& f : feature_formats())
    if (name == f.name) return &f;
  return nullptr;
}

std::string no_features_message(const std::string& path) {
  // From the broadest search (the .ckpt tree, what most users point at) to the index.
  const auto& formats = feature_formats();
  std::string list;
  for (size_t i = formats.size(); i-- > 0;) {
    list += formats[i].recognised_by;
    if (i > 0) list += i == 1 ? " or " : ", ";
  }
  return path + ": no feature files found (no " + list + ")";
}

namespace {

// The one format of `stage` that recognises `path`, or an empty opener when none does.
FeatureOpener probe_stage(const std::string& path, FormatDetection stage) {
  std::vector<std::pair<const char*, FeatureOpener>> found;
  for (const auto& f : feature_formats()) {
    if (f.detection != stage) continue;
    if (FeatureOpener open = f.probe(path)) found.emplace_back(f.name, std::move(open));
  }
  if (found.empty()) return {};
  FSDP_USAGE_CHECK(found.size() == 1,
                   str(path, ": holds files of several feature formats (", found[0].first, " and ",
                       found[1].first, ")"),
                   "keep each producer's dump in its own directory and point the path at one");
  return std::move(found[0].second);
}

std::string id_list(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return "[" + out + "]";
}

// DatasetOptions::layer_ids against the layers a dump records (DeepSpec's manifest, a native
// index converted from one); dumps that record none pass.
void check_layer_ids(const FeatureDataset& ds, const DatasetOptions& options) {
  const std::vector<int64_t> held = ds.captured_layer_ids();
  if (options.layer_ids.empty() || held.empty()) return;
  FSDP_USAGE_CHECK(held == options.layer_ids,
                   str(ds.root(), ": the ", ds.format(), " features hold target layers ",
                       id_list(held), " (target_layer_ids, layer outputs), but the draft reads ",
                       options.layers_key, " ", id_list(options.layer_ids)),
                   str("set ", options.layers_key,
                       " in the draft config to the features' layers, or use features dumped "
                       "for this draft"));
}

}  // namespace

std::shared_ptr<FeatureDataset> open_feature_dataset(const std::string& path,
                                                     const DatasetOptions& options) {
  FSDP_USAGE_CHECK(std::filesystem::exists(path), path + ": hidden-states path does not exist",
                   "check --train-hidden-states-path");
  for (const auto stage :
       {FormatDetection::kIndexed, FormatDetection::kDirectory, FormatDetection::kTree}) {
    if (FeatureOpener open = probe_stage(path, stage)) {
      std::shared_ptr<FeatureDataset> ds = open(options);
      check_layer_ids(*ds, options);
      return ds;
    }
  }
  FSDP_USAGE_FAIL(no_features_message(path),
                  "point the path at SpecForge hidden states (rows_*/data_*.ckpt[.gz]), another "
                  "producer's dump (docs/data.md) or the output of `fsdp-train convert`");
}

}  // namespace fsdp::data
