// Per-sample processing and collate (docs/reference.md §1.3) on hand-checkable values.
#include "data/batch.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

using namespace fsdp::data;

namespace {
RawSample raw(int64_t s, int64_t h, int64_t tag) {
  RawSample r;
  r.input_ids = at::arange(s, at::kLong) + 100 * tag;
  r.loss_mask = at::ones({s}, at::kLong);
  r.loss_mask[0] = 0;
  r.hidden_state =
      (at::arange(s, at::kFloat).view({s, 1}).expand({s, h}) + 1).to(at::kBFloat16).contiguous();
  r.aux_hidden_state = (at::arange(s, at::kFloat).view({s, 1}).expand({s, 3 * h}) + 10)
                           .to(at::kBFloat16)
                           .contiguous();
  r.source = "test";
  return r;
}
std::vector<int64_t> vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}
}  // namespace

TEST_CASE("process_sample shifts ids and hidden left, keeps loss mask, zeroes its last entry",
          "[data]") {
  const Sample s = process_sample(raw(5, 2, 0), 2048);
  CHECK(vec(s.input_ids) == std::vector<int64_t>{1, 2, 3, 4, 0});
  CHECK(vec(s.loss_mask) == std::vector<int64_t>{0, 1, 1, 1, 0});
  CHECK(vec(s.attention_mask) == std::vector<int64_t>{1, 1, 1, 1, 1});
  // target_hidden[t] = hidden[t+1] (= t+2), last row zero; aux not shifted (= t+10).
  CHECK(vec(s.target_hidden.select(1, 0)) == std::vector<int64_t>{2, 3, 4, 5, 0});
  CHECK(vec(s.aux_hidden.select(1, 5)) == std::vector<int64_t>{10, 11, 12, 13, 14});
  CHECK(s.aux_hidden.scalar_type() == at::kBFloat16);
  CHECK(s.target_hidden.sizes() == at::IntArrayRef({5, 2}));
}

TEST_CASE("process_sample truncates to max_length before shifting", "[data]") {
  const Sample s = process_sample(raw(6, 1, 0), 3);
  CHECK(vec(s.input_ids) == std::vector<int64_t>{1, 2, 0});
  CHECK(vec(s.loss_mask) == std::vector<int64_t>{0, 1, 0});
  CHECK(vec(s.target_hidden.select(1, 0)) == std::vector<int64_t>{2, 3, 0});
  CHECK(s.aux_hidden.size(0) == 3);
  const Sample one = process_sample(raw(4, 1, 0), 1);
  CHECK(vec(one.input_ids) == std::vector<int64_t>{0});
  CHECK(vec(one.loss_mask) == std::vector<int64_t>{0});
}

TEST_CASE("collate right-pads every tensor with zeros to the longest sample", "[data]") {
  std::vector<Sample> v = {process_sample(raw(3, 2, 1), 100), process_sample(raw(5, 2, 2), 100),
                           empty_sample(2)};
  const Batch b = collate(v);
  CHECK(b.input_ids.sizes() == at::IntArrayRef({3, 5}));
  CHECK(b.aux_hidden.sizes() == at::IntArrayRef({3, 5, 6}));
  CHECK(b.target_hidden.sizes() == at::IntArrayRef({3, 5, 2}));
  CHECK(vec(b.input_ids[0]) == std::vector<int64_t>{101, 102, 0, 0, 0});
  CHECK(vec(b.attention_mask[0]) == std::vector<int64_t>{1, 1, 1, 0, 0});
  CHECK(vec(b.loss_mask[1]) == std::vector<int64_t>{0, 1, 1, 1, 0});
  CHECK(vec(b.aux_hidden[0].select(1, 0)) == std::vector<int64_t>{10, 11, 12, 0, 0});
  CHECK(b.loss_mask[2].sum().item<int64_t>() == 0);
  CHECK(b.attention_mask[2].sum().item<int64_t>() == 0);
  CHECK(b.num_loss_tokens() == 1 + 3);
  CHECK(b.input_ids.scalar_type() == at::kLong);
  CHECK(b.target_hidden.scalar_type() == at::kBFloat16);

  std::vector<Sample> mixed = {process_sample(raw(3, 2, 0), 100),
                               process_sample(raw(3, 4, 0), 100)};
  CHECK_THROWS_WITH(collate(mixed), Catch::Contains("hidden size"));
}

TEST_CASE("process_window on a row window equals the slice of the whole processed sample",
          "[data]") {
  // Every (length, max_length, SP size, rank, halo): the rows a sequence-parallel rank reads
  // (FeatureDataset::read_rows) processed alone equal slice_batch of the whole sample.
  for (const int64_t s : {1, 2, 5, 7, 8, 13})
    for (const int64_t max_length : {int64_t{100}, int64_t{4}})
      for (const int size : {1, 2, 3, 4})
        for (const int64_t halo : {0, 2, 6})
          for (int rank = 0; rank < size; ++rank) {
            CAPTURE(s, max_length, size, halo, rank);
            const RawSample whole = raw(s, 2, 1);
            const Batch full = collate({process_sample(whole, max_length)});
            const Batch want = slice_batch(full, rank, size, halo, false);
            const int64_t total = std::min(s, max_length);
            const int64_t local = std::max<int64_t>(1, (total + size - 1) / size);
            const int64_t offset = rank * local, window = local + halo;
            RawSample part = whole;
            const int64_t begin = std::min(offset, s), end = std::min(offset + window + 1, s);
            part.hidden_state = whole.hidden_state.narrow(0, begin, end - begin).clone();
            part.aux_hidden_state = whole.aux_hidden_state.narrow(0, begin, end - begin).clone();
            part.row_offset = begin;
            const Batch got = collate({process_window(part, max_length, offset, window)});
            REQUIRE(got.seq_len() == want.seq_len());
            CHECK(at::equal(got.input_ids, want.input_ids));
            CHECK(at::equal(got.loss_mask, want.loss_mask));
            CHECK(at::equal(got.attention_mask, want.attention_mask));
            CHECK(at::equal(got.aux_hidden, want.aux_hidden));
            CHECK(at::equal(got.target_hidden, want.target_hidden));
          }
}

TEST_CASE("process_window refuses rows that do not cover the window", "[data]") {
  RawSample part = raw(8, 2, 0);
  part.hidden_state = part.hidden_state.narrow(0, 4, 2).clone();
  part.aux_hidden_state = part.aux_hidden_state.narrow(0, 4, 2).clone();
  part.row_offset = 4;
  CHECK_THROWS(process_window(part, 100, 2, 3));   // needs rows [2, 6)
  CHECK_NOTHROW(process_window(part, 100, 4, 1));  // rows [4, 6)
}
