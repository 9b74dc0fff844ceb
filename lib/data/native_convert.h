// `fsdp-train convert`: turns any feature dataset (a SpecForge .ckpt/.ckpt.gz tree, another
// producer's dump, or native shards; opened through data/formats.h) into native shards
// (data/native_format.h), in parallel across MPI ranks, resumable, verifying every shard it
// writes. Never modifies the input.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace fsdp::comm {
class Communicator;
}

namespace fsdp::data {

struct ConvertOptions {
  std::string input;                         // any feature dataset (open_feature_dataset)
  std::string output;                        // native dataset directory (created)
  uint64_t shard_bytes = uint64_t{1} << 30;  // target shard size, planned from .ckpt file sizes
  bool skip_bad_samples = false;
  bool overwrite = false;      // redo shards even when a verified .done marker exists
  std::string dtype = "bf16";  // hidden-state storage: "bf16" (exact) or "fp8_e4m3" (data/fp8.h)
  // Which keys a .ckpt input holds: "eagle3" (hidden_state, aux_hidden_state), "block" (a
  // DFlash/DSpark dump: hidden_states, and target_last_hidden_states where present), or "auto":
  // told from the first readable file's keys (refused when it holds both sets). Only "auto" for
  // the other formats, which name their tensors themselves.
  std::string ckpt_keys = "auto";
  // hidden_size 0 is taken from the features; block-draft .ckpt files whose first readable
  // sample has no target_last_hidden_states need it set (the target's hidden size).
  DatasetOptions dataset;
};

struct ConvertReport {
  std::string input_format;  // FeatureDataset::format() of the input
  std::string input_keys;    // .ckpt input: "eagle3" or "block" (ConvertOptions::ckpt_keys)
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
