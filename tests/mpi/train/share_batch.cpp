// Sequence parallelism over a format read whole (docs/usage.md "Sequence parallelism"): rank 0
// of the group holds the sample it read, the others nothing; train::share_batch gives every rank
// the slice data::slice_batch cuts from the whole sample, for lengths that do and do not divide
// the group, a sample shorter than the group, and a stand-in for a skipped sample.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include "comm/runtime.h"
#include "data/batch.h"
#include "mpi/shard/groups.h"
#include "train/seq_group.h"

using namespace fsdp;

namespace {

data::Batch whole_sample(int64_t s, int64_t h, int64_t seed) {
  at::manual_seed(static_cast<uint64_t>(seed));
  data::RawSample r;
  r.input_ids = at::randint(0, 1000, {s}, at::kLong);
  r.loss_mask = at::randint(0, 2, {s}, at::kLong);
  r.hidden_state = at::randn({s, h}).to(at::kBFloat16);
  r.aux_hidden_state = at::randn({s, 3 * h}).to(at::kBFloat16);
  r.source = "share_batch test";
  data::Batch b = data::collate({data::process_sample(r, 1000)});
  b.sample_indices = {seed};
  b.epoch = 2;
  b.batch_index = seed;
  b.bytes_read = 123;
  return b;
}

}  // namespace

TEST_CASE("share_batch: every rank gets its slice of rank 0's sample", "[train]") {
  auto world = testing::world_comm();
  const int rank = world->rank(), size = world->size();
  for (const int64_t s : {1, 2, 7, 16, 33})
    for (const int64_t halo : {0, 2, 6}) {
      CAPTURE(s, halo, size, rank);
      const data::Batch whole = whole_sample(s, 4, s * 10 + halo);
      data::Batch mine;
      if (rank == 0) {
        mine = whole;
      } else {
        mine.sample_indices = whole.sample_indices;
        mine.epoch = whole.epoch;
        mine.batch_index = whole.batch_index;
      }
      mine.awaits_share = true;
      const data::Batch got = train::share_batch(*world, mine, halo, false);
      const data::Batch want = data::slice_batch(whole, rank, size, halo);
      CHECK_FALSE(got.awaits_share);
      CHECK(got.shard_offset == want.shard_offset);
      CHECK(got.shard_local == want.shard_local);
      CHECK(got.shard_rank == rank);
      CHECK(got.sample_indices == whole.sample_indices);
      CHECK(got.batch_index == whole.batch_index);
      CHECK(got.bytes_read == (rank == 0 ? 123u : 0u));  // only rank 0 read
      CHECK(at::equal(got.input_ids, want.input_ids));
      CHECK(at::equal(got.loss_mask, want.loss_mask));
      CHECK(at::equal(got.attention_mask, want.attention_mask));
      CHECK(at::equal(got.aux_hidden, want.aux_hidden));
      CHECK(at::equal(got.target_hidden, want.target_hidden));
      CHECK(at::equal(got.full_loss_mask, want.full_loss_mask));
    }
  // A skipped sample's stand-in: its count reaches every rank.
  data::Batch stand_in;
  if (rank == 0) {
    stand_in = data::collate({data::empty_sample(4)});
    stand_in.num_skipped = 1;
  }
  stand_in.awaits_share = true;
  const data::Batch got = train::share_batch(*world, stand_in, 2, false);
  CHECK(got.num_skipped == 1);
  CHECK(got.num_loss_tokens() == 0);
  // A batch that does not await a share is returned as it is, without communication.
  data::Batch plain = whole_sample(5, 4, 1);
  CHECK(at::equal(train::share_batch(*world, plain, 2, false).input_ids, plain.input_ids));
}
