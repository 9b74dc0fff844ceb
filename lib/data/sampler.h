// The distributed sampler (cross-team contract, compatible with torch's DistributedSampler with
// drop_last=True): per-epoch permutation from (seed + epoch), rank r of W takes perm[r::W] cut
// to floor(N/W), micro-batches of B consecutive indices, last incomplete one dropped.
// Pure arithmetic: no file access. Its position can be saved and restored mid-epoch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

// Where a rank stands: `position` micro-batches of `epoch` have been consumed.
struct SamplerState {
  int64_t epoch = 0;
  int64_t position = 0;
  bool operator==(const SamplerState&) const = default;
};

class DistributedSampler {
 public:
  // num_samples N, rank r in [0, world_size), micro_batch_size B >= 1, seed.
  DistributedSampler(int64_t num_samples, int rank, int world_size, int64_t micro_batch_size,
                     uint64_t seed, bool shuffle = true);

  // The rank's sample indices for `epoch`: perm[rank::W] truncated to floor(N/W) entries,
  // where perm = randperm(N) from a CPU generator seeded with seed + epoch (identity order
  // when shuffle is false).
  std::vector<int64_t> epoch_indices(int64_t epoch) const;
  // floor(floor(N/W) / B): micro-batches per epoch on every rank.
  int64_t batches_per_epoch() const;
  // Indices of micro-batch `batch` (0-based) of `epoch`.
  std::vector<int64_t> batch_indices(int64_t epoch, int64_t batch) const;

  int64_t num_samples() const { return num_samples_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int64_t micro_batch_size() const { return micro_batch_size_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t num_samples_;
  int rank_;
  int world_size_;
  int64_t micro_batch_size_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace fsdp::data
