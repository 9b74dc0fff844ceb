// The native feature format: many samples per safetensors shard plus one index, read by mmap;
// and `convert`, which turns any feature dataset (a SpecForge .ckpt/.ckpt.gz tree, another
// producer's dump, or native shards) into it, in parallel across MPI ranks, resumable, verifying
// every shard it writes. Never modifies the input.
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
#include <string>
#include <vector>

#include "data/dataset.h"

namespace fsdp::comm {
class Communicator;
}

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

struct ConvertOptions {
  std::string input;                         // any feature dataset (open_feature_dataset)
  std::string output;                        // native dataset directory (created)
  uint64_t shard_bytes = uint64_t{1} << 30;  // target shard size, planned from .ckpt file sizes
  bool skip_bad_samples = false;
  bool overwrite = false;      // redo shards even when a verified .done marker exists
  std::string dtype = "bf16";  // hidden-state storage: "bf16" (exact) or "fp8_e4m3" (data/fp8.h)
  DatasetOptions dataset;
};

struct ConvertReport {
  std::string input_format;  // FeatureDataset::format() of the input
  int64_t shards_total = 0;
  int64_t shards_written = 0;   // by this rank
  int64_t shards_skipped = 0;   // by this rank: already complete and verified
  int64_t samples_written = 0;  // by this rank
  int64_t bad_samples = 0;      // all ranks
  uint64_t bytes_written = 0;   // by this rank
  double seconds = 0;
  std::vector<std::string> bad_sample_lines;  // "file: problem" (this rank)
};

// The shard plan: consecutive runs of samples whose source sizes add up to about shard_bytes (at
// least one sample per shard). Deterministic from the sizes, so every rank computes the same
// plan without communication. Returns [first, end) per shard.
std::vector<std::pair<int64_t, int64_t>> plan_shards(const std::vector<uint64_t>& sizes,
                                                     uint64_t shard_bytes);
// Same over files' sizes on disk.
std::vector<std::pair<int64_t, int64_t>> plan_shards(const std::vector<std::string>& files,
                                                     uint64_t shard_bytes);

// Converts; rank r of `comm` (nullptr = single process) handles shards r, r+W, ... Then rank 0
// writes the index from the shard headers. Every rank returns the same shards_total and the
// all-reduced bad_samples. Throws BadSampleError on bad input unless skip_bad_samples.
ConvertReport convert_to_native(const ConvertOptions& options, comm::Communicator* comm = nullptr);

}  // namespace fsdp::data
