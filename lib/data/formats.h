// Feature files of the other producers (docs/data.md): speculators (one hs_<i>.safetensors per
// sample, bf16 or fp8, with the loss mask in the preprocessed Arrow dataset), NVIDIA ModelOpt
// ({conversation_id}.pt dicts) and DeepSpec's target cache (manifest.json + samples.idx records +
// raw shards, read through mmap). Each reader presents its samples as the four tensors of a
// SpecForge .ckpt (validate_sample), so training, convert and vocab-map read them directly.
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"

namespace fsdp::data {

// The dataset of a producer's dump at `path`, or nullptr when `path` holds none of these formats
// (then the caller tries a .ckpt tree). Throws UsageError when the path holds a recognised but
// unreadable dump (e.g. a manifest that does not parse), or more than one format.
std::shared_ptr<FeatureDataset> open_producer_dataset(const std::string& path,
                                                      const DatasetOptions& options);

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
