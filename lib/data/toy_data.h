// Synthetic data with learnable structure for tests, benchmarks and the quickstart: a target
// model directory (config.json, sharded safetensors with an index) and SpecForge-format .ckpt
// features produced by a small random network run over Markov-chain token sequences, plus a
// matching draft config. Deterministic from the seed. Never used for real training data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

struct ToyDataOptions {
  std::string out_dir;
  int64_t num_samples = 256;
  int64_t min_len = 64;
  int64_t max_len = 128;
  // When given, sample i has lengths[i % size] tokens (each >= 2) and min/max_len are unused:
  // a length distribution of real data (benchmarks/device/run.sh).
  std::vector<int64_t> lengths;
  int64_t hidden_size = 64;
  int64_t vocab_size = 512;
  int64_t draft_vocab_size = 256;
  int64_t successors = 4;        // Markov chain: candidate next tokens per token
  int64_t samples_per_dir = 64;  // SpecForge groups files in rows_<a>-<b>/ folders
  uint64_t seed = 0;
  void validate() const;  // throws UsageError naming the flag
};

struct ToyDataPaths {
  std::string target_model_dir;   // <out>/target
  std::string draft_config;       // <out>/draft_config.json
  std::string hidden_states_dir;  // <out>/hidden_states
  uint64_t feature_bytes = 0;     // bytes of .ckpt files written
};

// Writes everything under options.out_dir (created). Existing files are overwritten.
ToyDataPaths generate_toy_data(const ToyDataOptions& options);

}  // namespace fsdp::data
