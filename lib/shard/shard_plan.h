// The shard plan: pure arithmetic on flat layouts. Where each parameter sits in its unit's flat
// buffer, how the buffer is padded and split across a group, which pieces of which parameters
// a rank's shard holds, and which old shards feed a new shard when the world size changes.
// No tensors and no communication here, so every rule can be unit-tested in isolation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::shard {

// One parameter inside a flat buffer.
struct ParamSlot {
  std::string name;            // fully qualified module parameter name ("block.q.weight")
  std::vector<int64_t> shape;  // original shape
  int64_t numel = 0;
  int64_t offset = 0;  // start inside the unpadded flat buffer
  bool decay = true;   // weight decay applies (AdamW exclusion rule decided by caller)
};

// One flat buffer: the trainable or the frozen parameters of a unit, concatenated in module
// order, padded at the end to a multiple of the group size. Rank r owns
// [r * shard_numel, (r + 1) * shard_numel) of the padded buffer.
struct FlatLayout {
  std::string unit;
  bool trainable = true;
  std::vector<ParamSlot> params;
  int64_t numel = 0;         // sum of parameter numels
  int64_t padded_numel = 0;  // numel rounded up to a multiple of group_size
  int64_t shard_numel = 0;   // padded_numel / group_size
  int group_size = 1;

  int64_t shard_begin(int rank) const { return rank * shard_numel; }
  // Elements of rank's shard that hold parameter values (the rest is padding).
  int64_t valid_numel(int rank) const;
  // "unit/trainable" or "unit/frozen": key in manifests and state files.
  std::string key() const;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool decay = true;
};

// Lays out params in the given order. group_size >= 1 (checked).
FlatLayout make_flat_layout(const std::string& unit, bool trainable,
                            const std::vector<ParamSpec>& params, int group_size);

int64_t padded_size(int64_t numel, int group_size);

// Intersection of one parameter with a rank's shard.
struct ShardPiece {
  int param = 0;             // index into FlatLayout::params
  int64_t param_offset = 0;  // first element inside the (flattened) parameter
  int64_t shard_offset = 0;  // first element inside the rank's shard
  int64_t length = 0;
};
// Pieces in increasing shard_offset order; padding is not covered by any piece.
std::vector<ShardPiece> shard_pieces(const FlatLayout& layout, int rank);

// A run of elements copied from an old shard into a new one when resharding.
struct ReshardSegment {
  int src_rank = 0;
  int64_t src_offset = 0;  // inside the old rank's shard
  int64_t dst_offset = 0;  // inside the new rank's shard
  int64_t length = 0;
};
// The unpadded content (numel elements) is the same whatever the group size; the new shard of
// new_rank (new_shard_numel elements) is filled from old shards of old_shard_numel elements.
// Elements past numel are padding and not covered.
std::vector<ReshardSegment> reshard_segments(int64_t numel, int64_t old_shard_numel,
                                             int64_t new_shard_numel, int new_rank);

}  // namespace fsdp::shard
