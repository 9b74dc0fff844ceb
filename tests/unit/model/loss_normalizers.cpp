// The TTT loss's normalisers (model/loss_normalizers.h) from known loss rows and weights: B*S or
// the position rows per step, a packed row's documents, the trainer's factor P / accumulation.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <vector>

#include "model/loss_normalizers.h"
#include "model/loss_rows.h"

using namespace fsdp::model;

namespace {
// fp32 weights of step i's rows: 1 except the rows whose index is in `zero`.
std::vector<at::Tensor> weights(const LossRows& rows, int64_t zero_row) {
  std::vector<at::Tensor> w;
  for (const at::Tensor& take : rows.target) w.push_back(take.ne(zero_row).to(at::kFloat));
  return w;
}
}  // namespace

TEST_CASE("loss normalisers: batch tokens, position rows, documents", "[model][loss]") {
  // Two samples of 5; loss rows at (0, 1..4) and (1, 0..2): 7 rows.
  at::Tensor mask = torch::tensor({0, 1, 1, 1, 1, 1, 1, 1, 0, 0}, torch::kLong).view({2, 5});
  const LossRows rows = LossRows::build(mask, 3, torch::kCPU);
  REQUIRE(rows.count == std::vector<int64_t>{7, 6, 4});
  LossOptions o;
  o.ttt_length = 3;
  o.accumulation_steps = 4;
  const LossNormalizers batch = loss_normalizers(rows, weights(rows, 0), o);
  REQUIRE(batch.steps.size() == 3);
  for (const StepNormalizer& s : batch.steps) CHECK(s.tokens == 10.0);
  // Step 0: 7 rows, the first weighted 0.
  CHECK(batch.steps[0].positions.item<float>() == 6.0f);
  CHECK(batch.steps[0].divide(torch::tensor(20.0f)).item<float>() == 2.0f);
  CHECK(batch.backward_loss(torch::tensor(8.0f)).item<float>() == 2.0f);

  o.normalization = LossNormalization::kValidTokens;
  const LossNormalizers tokens = loss_normalizers(rows, weights(rows, 0), o);
  CHECK(tokens.steps[0].tokens < 0);
  CHECK(tokens.steps[0].divide(torch::tensor(12.0f)).item<float>() == 2.0f);
  // No weighted row: the denominator is at least 1 (LK's at least 1e-8).
  StepNormalizer empty = tokens.steps[2];
  empty.positions = torch::zeros({});
  CHECK(empty.divide(torch::tensor(0.5f)).item<float>() == 0.5f);
  CHECK(empty.lk_denominator(at::kDouble).item<double>() == 1e-8);

  // Packed: one row of documents 4 and 6; per document: its length, or its position rows.
  at::Tensor packed = torch::ones({1, 10}, torch::kLong);
  const LossRows prows = LossRows::build(packed, 2, torch::kCPU, {4, 6});
  o.normalization = LossNormalization::kBatchTokens;
  const LossNormalizers docs = loss_normalizers(prows, weights(prows, -1), o);
  CHECK(torch::equal(docs.steps[1].lengths, torch::tensor({4.0f, 6.0f})));
  // Step 1 scores positions t >= 1 of each document: 3 and 5 rows.
  CHECK(torch::equal(docs.steps[1].positions, torch::tensor({3.0f, 5.0f})));
  const LossUnits units = LossUnits::of_step(prows, 1);
  CHECK(torch::equal(units.sum(torch::ones({8})), torch::tensor({3.0f, 5.0f})));
  CHECK(units.total(torch::tensor({3.0f, 5.0f})).item<float>() == 8.0f);
}
