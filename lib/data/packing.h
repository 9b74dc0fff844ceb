// Exact sequence packing (docs/usage.md "Packing"): the samples of one accumulation window, as
// the sampler gives them, are bin-packed longest-first into micro-batches of at most a token
// budget, each one row of whole documents (model::SeqLayout). Which samples an optimizer step
// sees never changes; only how they are grouped into micro-batches. Pure host code: no file
// access, no collectives (the trainer agrees on the bin count across ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"

namespace fsdp::data {

// The rows of a collated micro-batch as samples again, each cut to its valid length
// (attention_mask), in row order; a row standing in for a skipped sample (no valid token) keeps
// its single all-zero token.
std::vector<Sample> split_rows(const Batch& batch);

// First-fit decreasing: the number of bins of `budget` tokens that hold items of `lengths`
// (each 1 <= length <= budget; throws UsageError naming the budget otherwise).
int64_t count_bins(const std::vector<int64_t>& lengths, int64_t budget);

// Exactly `bins` bins (count_bins(lengths, budget) <= bins <= lengths.size()), none empty, none
// over the budget: items longest first, each into the least-filled bin it fits (ties: the lower
// bin), falling back to first-fit decreasing with the emptiest bins then filled from the bins
// holding most items. Each bin lists item indices in ascending order (the sampler's order).
// Deterministic.
std::vector<std::vector<int64_t>> pack_bins(const std::vector<int64_t>& lengths, int64_t budget,
                                            int64_t bins);

// One packed micro-batch: the documents back to back in one row (B = 1, S = their total length),
// Batch::documents their lengths. Tensors as collate() makes them (pinned when asked).
Batch collate_packed(const std::vector<Sample>& docs, bool pin_memory = false);

}  // namespace fsdp::data
