// Loss-mask guards: counting loss tokens as training sees them (truncated to max_length, the
// last position never counting), the start-up refusal of all-zero and near-zero masks, and the
// per-batch count of samples without a loss token.
#include "data/loss_mask_stats.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "data/dataset.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {
// A .ckpt dataset of samples with the given loss masks (hidden size 4).
std::shared_ptr<FeatureDataset> dataset_of(const std::string& name,
                                           const std::vector<std::vector<int64_t>>& masks) {
  const auto dir = temp_dir(name);
  for (size_t i = 0; i < masks.size(); ++i) {
    auto d = make_sample(static_cast<int64_t>(masks[i].size()), 4, static_cast<int64_t>(i));
    d.insert_or_assign("loss_mask", at::tensor(masks[i]));
    write_ckpt(dir / "rows_0" / ("data_" + std::to_string(i) + ".ckpt"), d);
  }
  return open_feature_dataset(dir.string());
}
}  // namespace

TEST_CASE("sample_loss_tokens: mask[:min(S, max_length)] without its last position", "[data]") {
  const at::Tensor m = at::tensor(std::vector<int64_t>{0, 1, 1, 0, 1, 1});
  CHECK(sample_loss_tokens(m, 100) == 3);  // {0,1,1,0,1}: the last 1 has no next token
  CHECK(sample_loss_tokens(m, 5) == 2);    // {0,1,1,0}
  CHECK(sample_loss_tokens(m, 2) == 0);    // {0}
  CHECK(sample_loss_tokens(at::ones({1}, at::kLong), 8) == 0);
  CHECK(sample_loss_tokens(at::ones({1, 4}, at::kLong), 8) == 3);  // [1, S] as in .ckpt files
}

TEST_CASE("count_loss_mask counts tokens, loss tokens and samples without any", "[data]") {
  auto ds = dataset_of("lm_count", {{0, 1, 1, 1}, {0, 0, 0, 0}, {1, 1, 0, 0, 0, 1}, {0, 0, 0, 1}});
  const LossMaskCount c = count_loss_mask(*ds, 64);
  CHECK(c.samples == 4);
  CHECK(c.tokens == 4 + 4 + 6 + 4);
  CHECK(c.loss_tokens == 2 + 0 + 2 + 0);
  CHECK(c.zero_loss_samples == 2);  // sample 3's only 1 is its last position
  CHECK(c.unreadable == 0);
  CHECK(c.share() == Approx(4.0 / 18));
  CHECK_NOTHROW(check_loss_mask(c, "--train-hidden-states-path", "/data"));
  // Truncated to 3 tokens: {0,1}, {0,0}, {1,1}, {0,0}.
  const LossMaskCount t = count_loss_mask(*ds, 3);
  CHECK(t.tokens == 12);
  CHECK(t.loss_tokens == 3);
  CHECK(t.zero_loss_samples == 2);
}

TEST_CASE("check_loss_mask refuses all-zero masks and a share below the minimum", "[data]") {
  auto ds = dataset_of("lm_zero", {{0, 0, 0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0, 1}});
  const LossMaskCount c = count_loss_mask(*ds, 64);
  CHECK(c.loss_tokens == 0);
  CHECK(c.zero_loss_samples == 3);
  const std::string msg = error_of([&] { check_loss_mask(c, "--train-hidden-states-path", "/d"); });
  CHECK_THAT(msg, Catch::Contains("--train-hidden-states-path /d"));
  CHECK_THAT(msg, Catch::Contains("0 loss tokens in 13 tokens of 3 samples"));
  try {
    check_loss_mask(c, "--train-hidden-states-path", "/d");
    FAIL("no error");
  } catch (const fsdp::UsageError& e) {
    CHECK_THAT(e.hint(), Catch::Contains("loss-mask convention"));
  }
  // 1 loss token in 2000 (0.05%) is refused, 2 in 2000 (0.1%) accepted.
  LossMaskCount low;
  low.samples = 10;
  low.tokens = 2000;
  low.loss_tokens = 1;
  CHECK_THAT(error_of([&] { check_loss_mask(low, "--eval-hidden-states-path", "/e"); }),
             Catch::Contains("below the minimum of 0.1%"));
  low.loss_tokens = 2;
  CHECK_NOTHROW(check_loss_mask(low, "--eval-hidden-states-path", "/e"));
  // Nothing readable: nothing to judge (the loader reports the bad samples).
  CHECK_NOTHROW(check_loss_mask(LossMaskCount{}, "--train-hidden-states-path", "/d"));
}

TEST_CASE("zero_loss_rows: rows without a loss token, less the rows of skipped samples", "[data]") {
  Batch b;
  b.input_ids = at::zeros({4, 3}, at::kLong);
  b.loss_mask = at::tensor(std::vector<int64_t>{0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0}).view({4, 3});
  CHECK(zero_loss_rows(b) == 2);
  b.num_skipped = 1;  // one all-zero row stands in for a skipped sample
  CHECK(zero_loss_rows(b) == 1);
  CHECK(zero_loss_rows(Batch{}) == 0);
}
