// Noise augmentation of the aux hidden states (the fc input) of training samples, as speculators
// and the original EAGLE train (docs/usage.md "Noise augmentation"). The noise of a sample is a
// pure function of (run seed, epoch, dataset index): never of a generator shared across samples,
// so a resumed run and a run on another number of ranks see the same noise per sample. Never
// used for evaluation batches, never applied to the target hidden state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "data/loader_options.h"

namespace fsdp::data {

// The counter-based stream of one sample: Philox4x32-10 keyed by a hash of (seed, epoch) with the
// dataset index as its subsequence, so distinct samples of an epoch never share a stream.
struct NoiseStream {
  uint64_t key = 0;
  uint64_t subsequence = 0;
};
NoiseStream noise_stream(uint64_t seed, int64_t epoch, int64_t sample_index);

// aux + noise as a new tensor of aux's dtype and shape ([S, n*H]); aux itself is never written
// (it may be a view of a memory-mapped feature file). The noise is drawn in fp32 row-major from
// the sample's stream, added to the fp32 value of each element and rounded once to aux's dtype:
// token t's noise does not depend on where the sample was truncated. std 0 returns aux itself.
at::Tensor add_aux_noise(const at::Tensor& aux, const NoiseOptions& options, int64_t epoch,
                         int64_t sample_index);

}  // namespace fsdp::data
