// Muon on sharded parameters (--optimizer muon; ShardEngine::muon_step calls it per flat buffer):
// Newton-Schulz needs each whole matrix, so the matrices of a flat buffer are updated one at a
// time. A rank's momentum stays fp32 in its shard and the elementwise parts (momentum, Nesterov,
// weight decay, the step) run on its own slice; only the update matrix travels: assembled from
// every rank's slice (an all-reduce of the matrix with zeros outside each slice: exact), the
// orthogonalisation runs once, on the matrix's owner (round-robin over the ranks by matrix
// index), and is broadcast; each rank keeps its slice. Memory added, one matrix at a time: two
// fp32 copies of it on every rank (the assembled update, the broadcast result), plus the
// Newton-Schulz workspace in bf16 on its owner. Equal, bit for bit, to optim::muon_update on the
// whole matrices (the sums only add zeros).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "optim/muon.h"
#include "shard/shard_plan.h"

namespace fsdp::shard {

// The rank that orthogonalises matrix `index` of `count` Muon matrices (0 .. count-1 in layout
// order, over every flat buffer of the model) among `world` ranks.
int muon_owner(int64_t index, int world);

// One Muon step of the parameters `muon_params` (indices into layout.params, each 2-D) of one
// flat buffer: master, grad and momentum are this rank's shards (fp32, layout.shard_numel,
// contiguous, the grad already averaged and scaled as the step wants it); `first_index` is the
// model-wide index of the first of them (for the owners). Collective over `comm` (the shard
// group: every rank calls it with the same arguments but its own shards; null for a group of one).
void muon_shard_step(const FlatLayout& layout, int rank, comm::Communicator* comm,
                     const at::Tensor& master, const at::Tensor& grad, const at::Tensor& momentum,
                     const std::vector<int>& muon_params, int64_t first_index, double lr,
                     const optim::MuonOptions& options);

}  // namespace fsdp::shard
