// Flat layout arithmetic (see shard_plan.h). Pure functions: must never touch tensors or MPI.
#include "shard/shard_plan.h"

#include <algorithm>

#include "core/error.h"

namespace fsdp::shard {

int64_t padded_size(int64_t numel, int group_size) {
  FSDP_ASSERT(group_size >= 1, "group size must be positive");
  return (numel + group_size - 1) / group_size * group_size;
}

int64_t FlatLayout::valid_numel(int rank) const {
  const int64_t begin = shard_begin(rank);
  return std::clamp<int64_t>(numel - begin, 0, shard_numel);
}

std::string FlatLayout::key() const {
  return unit + (trainable ? "/trainable" : "/frozen");
}

FlatLayout make_flat_layout(const std::string& unit, bool trainable,
                            const std::vector<ParamSpec>& params, int group_size) {
  FSDP_CHECK(group_size >= 1, str("group size ", group_size, " for unit ", unit),
             "shard groups must have at least one rank");
  FlatLayout l;
  l.unit = unit;
  l.trainable = trainable;
  l.group_size = group_size;
  for (const auto& p : params) {
    ParamSlot s;
    s.name = p.name;
    s.shape = p.shape;
    s.numel = 1;
    for (int64_t d : p.shape) s.numel *= d;
    s.offset = l.numel;
    s.decay = p.decay;
    l.numel += s.numel;
    l.params.push_back(std::move(s));
  }
  l.padded_numel = padded_size(l.numel, group_size);
  l.shard_numel = l.padded_numel / group_size;
  return l;
}

std::vector<ShardPiece> shard_pieces(const FlatLayout& layout, int rank) {
  std::vector<ShardPiece> out;
  const int64_t begin = layout.shard_begin(rank);
  const int64_t end = begin + layout.shard_numel;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamSlot& p = layout.params[i];
    const int64_t lo = std::max(begin, p.offset);
    const int64_t hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    out.push_back({static_cast<int>(i), lo - p.offset, lo - begin, hi - lo});
  }
  return out;
}

std::vector<ReshardSegment> reshard_segments(int64_t numel, int64_t old_shard_numel,
                                             int64_t new_shard_numel, int new_rank) {
  std::vector<ReshardSegment> out;
  const int64_t begin = static_cast<int64_t>(new_rank) * new_shard_numel;
  const int64_t end = std::min(begin + new_shard_numel, numel);
  if (begin >= end) return out;
  FSDP_CHECK(old_shard_numel > 0, str("old shard size 0 for ", numel, " elements"),
             "the saved manifest is inconsistent; re-save the state");
  for (int64_t pos = begin; pos < end;) {
    const int src = static_cast<int>(pos / old_shard_numel);
    const int64_t src_off = pos - src * old_shard_numel;
    const int64_t len = std::min(end - pos, old_shard_numel - src_off);
    out.push_back({src, src_off, pos - begin, len});
    pos += len;
  }
  return out;
}

}  // namespace fsdp::shard
