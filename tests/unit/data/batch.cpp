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
