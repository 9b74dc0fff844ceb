// Distributed sampler arithmetic (sampler.h); identical order to torch DistributedSampler.
#include "data/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"

namespace fsdp::data {

DistributedSampler::DistributedSampler(int64_t num_samples, int rank, int world_size,
                                       int64_t micro_batch_size, uint64_t seed, bool shuffle)
    : num_samples_(num_samples),
      rank_(rank),
      world_size_(world_size),
      micro_batch_size_(micro_batch_size),
      seed_(seed),
      shuffle_(shuffle) {
  FSDP_USAGE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
                   str("sampler: rank ", rank, " of world size ", world_size),
                   "this is a bug in fsdp-train: please report it with the command line and log");
  FSDP_USAGE_CHECK(micro_batch_size >= 1,
                   str("--draft-micro-batch-size must be >= 1, got ", micro_batch_size),
                   "set --draft-micro-batch-size to 1 or more");
  FSDP_USAGE_CHECK(num_samples >= 0, "sampler: negative dataset size",
                   "this is a bug in fsdp-train: please report it with the command line and log");
}

std::vector<int64_t> DistributedSampler::epoch_indices(int64_t epoch) const {
  const int64_t per_rank = num_samples_ / world_size_;
  std::vector<int64_t> out;
  out.reserve(per_rank);
  if (per_rank == 0) return out;
  at::Tensor perm;
  if (shuffle_) {
    // Same generator and kernel as Python torch.randperm(N, generator=g.manual_seed(seed+e)).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
    perm = at::randperm(num_samples_, gen, at::TensorOptions().dtype(at::kLong));
  } else {
    perm = at::arange(num_samples_, at::TensorOptions().dtype(at::kLong));
  }
  const int64_t* p = perm.data_ptr<int64_t>();
  for (int64_t k = 0; k < per_rank; ++k) out.push_back(p[rank_ + k * world_size_]);
  return out;
}

int64_t DistributedSampler::batches_per_epoch() const {
  return (num_samples_ / world_size_) / micro_batch_size_;
}

std::vector<int64_t> DistributedSampler::batch_indices(int64_t epoch, int64_t batch) const {
  FSDP_CHECK(batch >= 0 && batch < batches_per_epoch(),
             str("sampler: batch ", batch, " outside epoch of ", batches_per_epoch(), " batches"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  const auto all = epoch_indices(epoch);
  return std::vector<int64_t>(all.begin() + batch * micro_batch_size_,
                              all.begin() + (batch + 1) * micro_batch_size_);
}

}  // namespace fsdp::data
