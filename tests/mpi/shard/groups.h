// Communicator groups for sharding tests: the world, pretend-node splits for HYBRID_SHARD and
// sub-worlds of the first M ranks (resharding), built with MPI_Comm_split because the comm
// runtime reads FSDP_PRETEND_NODES only once, at init.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/mpi_backend.h"
#include "comm/runtime.h"
#include "shard/options.h"

namespace fsdp::testing {

inline std::shared_ptr<comm::Communicator> world_comm() {
  return comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
}

// Splits MPI_COMM_WORLD by color (MPI_UNDEFINED: this rank gets null). Collective.
inline std::shared_ptr<comm::Communicator> split_comm(int color, int key, comm::Group tag) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &c);
  if (c == MPI_COMM_NULL) return nullptr;
  return std::make_shared<comm::detail::MpiCommunicator>(tag, c);
}

// HYBRID_SHARD groups for `nodes` pretend nodes of contiguous ranks.
inline shard::CommGroups hybrid_groups(int nodes) {
  const auto& t = comm::topology();
  const int per_node = t.world_size / nodes;
  auto node = split_comm(t.world_rank / per_node, t.world_rank, comm::Group::kNode);
  auto cross = split_comm(t.world_rank % per_node, t.world_rank, comm::Group::kCrossNode);
  return {node, cross};
}

inline shard::CommGroups groups_for(shard::Strategy s, const std::shared_ptr<comm::Communicator>& world) {
  if (s == shard::Strategy::kNoShard) return {nullptr, world};
  return {world, nullptr};
}

}  // namespace fsdp::testing
