// The native feature format: many samples per safetensors shard plus one index, read by mmap
// (data/native_reader.cpp, registered as "native" in data/formats.cpp). `convert` writes it
// (data/native_convert.h). The reader never writes and never opens another format.
//
// Layout of DIR:
//   features.index.json            {"format":"fsdp-train-features","version":1 (bf16) or 2 (fp8),
//                                    "hidden_dtype":"bf16"|"fp8_e4m3","hidden_size":H,
//                                    "num_samples":N,"hidden_state_prenorm":false,
//                                    "captured_layer_ids":[...],"source_format":"ckpt",
//                                    "shards":[{"file","first_sample","num_samples","bytes"}],
//                                    "samples":[{"shard":k,"length":S,"source":"rows_0-1/data_0.ckpt"}]}
//   shard_<k:05d>.safetensors      per sample j (global index) tensors "<j>.input_ids" int64 [S],
//                                  "<j>.loss_mask" int64 [S], "<j>.hidden_state" bf16 [S,H],
//                                  "<j>.aux_hidden_state" bf16 [S,nH] (n captured layers);
//                                  fp8_e4m3: both hidden tensors float8_e4m3fn, plus
//                                  "<j>.hidden_state_scale" fp32 [S,1] and
//                                  "<j>.aux_hidden_state_scale" fp32 [S,n] (data/fp8.h)
//   shard_<k:05d>.done             written after the shard was re-read and verified (resume)
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "data/dataset.h"

namespace fsdp::data {

inline constexpr const char* kNativeIndexFile = "features.index.json";
inline constexpr const char* kNativeFormatName = "fsdp-train-features";
inline constexpr int kNativeFormatVersion = 1;
inline constexpr int kNativeFp8FormatVersion = 2;

// True when `dir` holds a native index.
bool is_native_dataset(const std::string& dir);

// Opens a native dataset (reads the index only; shards are mapped when first read). Samples the
// converter recorded as bad (skip mode) keep their index and throw BadSampleError when read, so
// both formats give the same sample numbering and the same skips.
std::shared_ptr<FeatureDataset> open_native_dataset(const std::string& dir,
                                                    const DatasetOptions& options = {});

// Shared by the reader and the converter (native_convert.h): the tensor keys of a sample, the
// name of shard k's file with extension `ext` ("safetensors" or "done"), and a JSON file of the
// layout (index or marker) parsed, a parse error naming the file.
inline constexpr const char* kNativeTensorKeys[4] = {"input_ids", "loss_mask", "hidden_state",
                                                     "aux_hidden_state"};
std::string native_shard_name(int64_t k, const char* ext);
nlohmann::json read_native_json(const std::string& path);

}  // namespace fsdp::data

// The converter's API, for includers of the whole format (tests, benchmarks).
#include "data/native_convert.h"
