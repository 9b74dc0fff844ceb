// Communicator groups for sharding tests: the world, pretend-node splits for HYBRID_SHARD and
// sub-worlds of the first M ranks (resharding), built with comm::split because the comm runtime
// reads FSDP_PRETEND_NODES only once, at init.
#pragma once

#include <memory>
#include <string>

#include "comm/runtime.h"
#include "shard/options.h"

namespace fsdp::testing {

inline std::shared_ptr<comm::Communicator> world_comm() {
  return comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
}

// Splits the world by color (negative: this rank gets null) into CPU communicators named
// after `tag`. Collective.
inline std::shared_ptr<comm::Communicator> split_comm(int color, int key, comm::Group tag) {
  return comm::split(comm::Group::kWorld, color, key, c10::Device(c10::kCPU),
                     comm::group_name(tag));
}

// HYBRID_SHARD groups for `nodes` pretend nodes of contiguous ranks.
inline shard::CommGroups hybrid_groups(int nodes) {
  const auto& t = comm::topology();
  const int per_node = t.world_size / nodes;
  auto node = split_comm(t.world_rank / per_node, t.world_rank, comm::Group::kNode);
  auto cross = split_comm(t.world_rank % per_node, t.world_rank, comm::Group::kCrossNode);
  return {node, cross};
}

inline shard::CommGroups groups_for(shard::Strategy s,
                                    const std::shared_ptr<comm::Communicator>& world) {
  if (s == shard::Strategy::kNoShard) return {nullptr, world};
  return {world, nullptr};
}

}  // namespace fsdp::testing
