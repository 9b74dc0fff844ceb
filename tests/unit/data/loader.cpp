// Loader: sampler order with 1 and 2 threads, mid-epoch resume, laziness (first batch after
// opening only the files it needs), measured data-wait time with a slow dataset, and retried
// reads of files that fail to open.
#include "data/loader.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

// Sample i has S = 3 + i % 4 tokens, hidden size 2, and ids i*10 + t: batches identify samples.
class KnownDataset : public FeatureDataset {
 public:
  explicit KnownDataset(int64_t n, double delay_s = 0) : n_(n), delay_(delay_s) {}
  std::string format() const override { return "test"; }
  int64_t size() const override { return n_; }
  RawSample read(int64_t i) const override {
    ++files_opened_;
    if (delay_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay_));
    const int64_t s = 3 + i % 4;
    return validate_sample(at::arange(s, at::kLong) + 10 * i, at::ones({s}, at::kLong),
                           at::full({s, 2}, static_cast<double>(i), at::kBFloat16),
                           at::full({s, 6}, static_cast<double>(-i), at::kBFloat16), source(i), {});
  }
  TokenSample read_tokens(int64_t i) const override {
    const auto r = read(i);
    return {r.input_ids, r.loss_mask};
  }
  std::string source(int64_t i) const override { return "known:" + std::to_string(i); }
  const std::string& root() const override { return root_; }

 private:
  int64_t n_;
  double delay_;
  std::string root_ = "known";
};

std::vector<std::vector<int64_t>> drain(DataLoader& l) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = l.next()) {
    // Row r must be sample sample_indices[r]: its (shifted) first id is 10*i + 1.
    for (int64_t r = 0; r < b->batch_size(); ++r)
      CHECK(b->input_ids[r][0].item<int64_t>() == 10 * b->sample_indices[r] + 1);
    out.push_back(b->sample_indices);
  }
  return out;
}

}  // namespace

TEST_CASE("loader yields the sampler's batches in order with 1 and 2 threads", "[data]") {
  auto ds = std::make_shared<KnownDataset>(23);
  for (int threads : {1, 2}) {
    for (int rank = 0; rank < 2; ++rank) {
      INFO("threads " << threads << " rank " << rank);
      DistributedSampler s(23, rank, 2, 3, 5);
      LoaderOptions o;
      o.prefetch_threads = threads;
      o.prefetch_depth = 2;
      DataLoader l(ds, s, o);
      for (int64_t epoch : {0, 1}) {
        l.start({epoch, 0});
        const auto got = drain(l);
        REQUIRE(static_cast<int64_t>(got.size()) == s.batches_per_epoch());
        for (int64_t k = 0; k < s.batches_per_epoch(); ++k)
          CHECK(got[k] == s.batch_indices(epoch, k));
        CHECK(l.state() == SamplerState{epoch, s.batches_per_epoch()});
      }
    }
  }
}

TEST_CASE("loader resumes mid-epoch with the same remaining order", "[data]") {
  auto ds = std::make_shared<KnownDataset>(40);
  DistributedSampler s(40, 1, 3, 2, 9);
  LoaderOptions o;
  o.prefetch_threads = 2;
  DataLoader a(ds, s, o);
  a.start({2, 0});
  std::vector<std::vector<int64_t>> first;
  for (int i = 0; i < 3; ++i) first.push_back(a.next()->sample_indices);
  const SamplerState saved = a.state();
  CHECK(saved == SamplerState{2, 3});
  const auto rest_a = drain(a);
  DataLoader b(ds, s, o);
  b.start(saved);
  const auto rest_b = drain(b);
  CHECK(rest_a == rest_b);
  CHECK(static_cast<int64_t>(first.size() + rest_b.size()) == s.batches_per_epoch());
  CHECK_THROWS_WITH(b.start({0, 99}), Catch::Contains("outside the epoch"));
}

TEST_CASE("first batch arrives after opening only the files it needs", "[data]") {
  // A real .ckpt tree of 60 files; micro-batch 2, depth 1, one thread: at most the first batch,
  // the one prefetched behind it and one in flight may have been read.
  const auto dir = temp_dir("lazy");
  for (int i = 0; i < 60; ++i)
    write_ckpt(dir / ("rows_0-60/data_" + std::to_string(i) + ".ckpt"), make_sample(4, 2, i));
  auto ds = open_feature_dataset(dir.string());
  REQUIRE(ds->size() == 60);
  CHECK(ds->files_opened() == 0);
  LoaderOptions o;
  o.prefetch_threads = 1;
  o.prefetch_depth = 1;
  DataLoader l(ds, DistributedSampler(60, 0, 1, 2, 0), o);
  l.start({0, 0});
  auto b = l.next();
  REQUIRE(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let prefetch run to its bound
  CHECK(ds->files_opened() <= 2 * 2);
  CHECK(b->bytes_read > 0);
}

TEST_CASE("data-wait time is measured and exposed", "[data]") {
  auto slow = std::make_shared<KnownDataset>(8, 0.02);
  LoaderOptions o;
  o.prefetch_threads = 1;
  o.prefetch_depth = 1;
  DataLoader l(slow, DistributedSampler(8, 0, 1, 2, 0), o);
  l.start({0, 0});
  drain(l);
  const auto st = l.stats();
  CHECK(st.batches == 4);
  CHECK(st.samples == 8);
  CHECK(st.data_wait_seconds > 0.05);  // 8 reads of 20 ms, one thread, little to overlap
  CHECK(st.read_seconds >= 0.15);
  const double taken = l.take_data_wait_seconds();
  CHECK(taken == Approx(st.data_wait_seconds));
  CHECK(l.take_data_wait_seconds() == 0.0);

  LoaderOptions bad;
  bad.prefetch_threads = 0;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("--loader-threads"));
}

namespace {
// Sample `flaky` fails to open `failures` times (SampleReadError), then reads normally; sample
// `corrupt` always has bad content (BadSampleError, never retried).
class FlakyDataset : public KnownDataset {
 public:
  FlakyDataset(int64_t n, int64_t flaky, int failures, int64_t corrupt = -1)
      : KnownDataset(n), flaky_(flaky), failures_(failures), corrupt_(corrupt) {}
  RawSample read(int64_t i) const override {
    if (i == flaky_ && failures_ > 0) {
      --failures_;
      throw SampleReadError(source(i) + ": cannot open (Stale file handle)", "", __FILE__,
                            __LINE__);
    }
    if (i == corrupt_)
      throw BadSampleError(source(i) + ": input_ids is empty", "", __FILE__, __LINE__);
    return KnownDataset::read(i);
  }

 private:
  int64_t flaky_;
  mutable int failures_;
  int64_t corrupt_;
};

LoaderOptions retry_options(bool skip) {
  LoaderOptions o;
  o.max_length = 64;
  o.read_retries = 3;
  o.retry_delay_s = 0.01;
  o.skip_bad_samples = skip;
  return o;
}
}  // namespace

TEST_CASE("a file that fails to open is read again before it counts as bad", "[data]") {
  // Two failures, three retries: the sample arrives, the retries are counted.
  auto ds = std::make_shared<FlakyDataset>(8, 5, 2);
  DataLoader l(ds, DistributedSampler(8, 0, 1, 2, 0, false), retry_options(false));
  l.start({0, 0});
  const auto batches = drain(l);
  CHECK(batches.size() == 4);
  CHECK(l.stats().read_retries == 2);
  CHECK(l.stats().bad_samples == 0);

  // Four failures: after three retries it is a bad sample (an error, or skipped when asked).
  auto ds2 = std::make_shared<FlakyDataset>(8, 1, 4);
  DataLoader l2(ds2, DistributedSampler(8, 0, 1, 2, 0, false), retry_options(false));
  l2.start({0, 0});
  CHECK_THROWS_WITH(l2.next(), Catch::Contains("known:1: cannot open (Stale file handle)"));
  auto ds3 = std::make_shared<FlakyDataset>(8, 1, 4);
  DataLoader l3(ds3, DistributedSampler(8, 0, 1, 2, 0, false), retry_options(true));
  l3.start({0, 0});
  auto b = l3.next();
  REQUIRE(b);
  CHECK(b->num_skipped == 1);
  CHECK(l3.stats().read_retries == 3);

  // Wrong content is not retried.
  auto ds4 = std::make_shared<FlakyDataset>(8, -1, 0, 2);
  DataLoader l4(ds4, DistributedSampler(8, 0, 1, 2, 0, false), retry_options(true));
  l4.start({0, 0});
  while (l4.next()) {
  }
  CHECK(l4.stats().read_retries == 0);
  CHECK(l4.stats().bad_samples == 1);
}

TEST_CASE("sequence parallelism: group rank 0 reads for the group, or each rank its rows",
          "[data]") {
  // A format read whole: rank 1 of a group of 2 reads nothing and waits for rank 0's sample;
  // rank 0 reads it whole and unsliced (train::share_batch slices it).
  auto ds = std::make_shared<KnownDataset>(9);
  LoaderOptions o;
  o.sp_size = 2;
  o.sp_halo = 2;
  o.sp_rank = 1;
  DataLoader other(ds, DistributedSampler(9, 0, 1, 1, 0), o);
  other.start({0, 0});
  std::vector<int64_t> seen;
  while (auto b = other.next()) {
    CHECK(b->awaits_share);
    CHECK_FALSE(b->input_ids.defined());
    CHECK(b->bytes_read == 0);
    seen.push_back(b->sample_indices.at(0));
  }
  CHECK(ds->files_opened() == 0);
  o.sp_rank = 0;
  DataLoader first(ds, DistributedSampler(9, 0, 1, 1, 0), o);
  first.start({0, 0});
  std::vector<int64_t> read;
  while (auto b = first.next()) {
    CHECK(b->awaits_share);
    CHECK_FALSE(b->sharded());
    const int64_t i = b->sample_indices.at(0);
    CHECK(b->seq_len() == 3 + i % 4);
    CHECK(b->input_ids[0][0].item<int64_t>() == 10 * i + 1);
    read.push_back(i);
  }
  CHECK(read == seen);

  // A format that reads rows alone: every rank its window, equal to the whole sample's slice.
  class RowsDataset : public KnownDataset {
   public:
    using KnownDataset::KnownDataset;
    bool reads_rows() const override { return true; }
  };
  auto rows = std::make_shared<RowsDataset>(9);
  for (int rank = 0; rank < 2; ++rank) {
    o.sp_rank = rank;
    DataLoader l(rows, DistributedSampler(9, 0, 1, 1, 0), o);
    l.start({0, 0});
    while (auto b = l.next()) {
      CHECK_FALSE(b->awaits_share);
      REQUIRE(b->sharded());
      const int64_t i = b->sample_indices.at(0);
      const Batch whole = collate({process_sample(rows->read(i), o.max_length)});
      const Batch want = slice_batch(whole, rank, 2, o.sp_halo);
      CHECK(b->shard_offset == want.shard_offset);
      CHECK(b->shard_local == want.shard_local);
      CHECK(at::equal(b->input_ids, want.input_ids));
      CHECK(at::equal(b->loss_mask, want.loss_mask));
      CHECK(at::equal(b->target_hidden, want.target_hidden));
      CHECK(at::equal(b->aux_hidden, want.aux_hidden));
      CHECK(at::equal(b->full_loss_mask, want.full_loss_mask));
    }
  }
}
