// Target head: the tiled path (t2d rows for target_p, full-vocab argmax in tiles) gives the same
// target_p, argmax and position mask as the dense [B, S, V] reference; padding rows are 1/Vd.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "model/target_head.h"

using namespace fsdp::model;

namespace {

at::Tensor random_t2d(int64_t V, int64_t Vd) {
  at::Tensor perm = torch::randperm(V).narrow(0, 0, Vd);
  at::Tensor t2d = torch::zeros({V}, torch::kBool);
  t2d.index_put_({perm}, true);
  return t2d;
}

}  // namespace

TEST_CASE("tiled target head equals the dense reference", "[model][target]") {
  torch::manual_seed(5);
  const int64_t B = 2, S = 9, H = 16, V = 300, Vd = 70, T = 3;
  at::Tensor W = torch::randn({V, H}, torch::kDouble);
  at::Tensor t2d = random_t2d(V, Vd);
  TargetHead head(W, t2d);
  CHECK(head.draft_vocab_size() == Vd);
  at::Tensor hidden = torch::randn({B, S, H}, torch::kDouble);
  at::Tensor loss_mask = torch::randint(0, 2, {B, S}, torch::kLong);
  TargetDistribution dense = head.compute_dense(hidden, loss_mask, T);
  for (int64_t tile : {1, 7, 64, 299, 300, 1000}) {
    INFO("tile " << tile);
    TargetDistribution tiled = head.compute_tiled(hidden, loss_mask, T, tile);
    CHECK(torch::equal(tiled.target_ids, dense.target_ids));
    CHECK(torch::equal(tiled.position_mask, dense.position_mask));
    CHECK((tiled.target_p - dense.target_p).abs().max().item<double>() < 1e-6);  // fp32 softmax
    CHECK(torch::equal(tiled.target_p.argmax(-1), dense.target_p.argmax(-1)));
  }
  // Independent check of the semantics: argmax over all V, softmax over t2d columns only.
  at::Tensor logits = torch::matmul(hidden, W.t());
  CHECK(torch::equal(dense.target_ids, logits.argmax(-1)));
  at::Tensor ref_p = logits.index({torch::indexing::Ellipsis, t2d}).softmax(-1);
  CHECK((dense.target_p.narrow(1, 0, S).to(torch::kDouble) - ref_p).abs().max().item<double>() <
        1e-6);
  CHECK(torch::equal(dense.position_mask,
                     loss_mask * t2d.index({logits.argmax(-1)}).to(torch::kLong)));
  // Padding rows for the last steps are uniform.
  CHECK(dense.target_p.size(1) == S + T);
  CHECK((dense.target_p.narrow(1, S, T) - 1.0 / Vd).abs().max().item<double>() < 1e-9);
}

TEST_CASE("tiled argmax breaks ties toward the smallest id across tiles", "[model][target]") {
  const int64_t V = 10, H = 2;
  at::Tensor W = torch::zeros({V, H}, torch::kDouble);
  W[3] = torch::tensor({1.0, 0.0}, torch::kDouble);
  W[8] = torch::tensor({1.0, 0.0}, torch::kDouble);  // same logit as id 3, in a later tile
  at::Tensor t2d = torch::zeros({V}, torch::kBool);
  t2d.narrow(0, 0, 4).fill_(true);
  TargetHead head(W, t2d);
  at::Tensor x = torch::tensor({2.0, 5.0}, torch::kDouble).view({1, 1, H});
  for (int64_t tile : {1, 3, 4, 10}) {
    CHECK(head.tiled_argmax(x, tile).item<int64_t>() == 3);
  }
  // Negative logits: zero rows win.
  at::Tensor xn = torch::tensor({-2.0, 0.0}, torch::kDouble).view({1, 1, H});
  CHECK(head.tiled_argmax(xn, 3).item<int64_t>() == 0);
}

TEST_CASE("bf16 target head: tiled matches dense", "[model][target]") {
  torch::manual_seed(6);
  const int64_t V = 500, H = 32, Vd = 128;
  TargetHead head(torch::randn({V, H}).to(torch::kBFloat16), random_t2d(V, Vd));
  at::Tensor hidden = torch::randn({1, 20, H}).to(torch::kBFloat16);
  at::Tensor loss_mask = torch::ones({1, 20}, torch::kLong);
  TargetDistribution a = head.compute(hidden, loss_mask, 2, TargetImpl::kTiled, 100);
  TargetDistribution b = head.compute(hidden, loss_mask, 2, TargetImpl::kDense);
  CHECK(torch::equal(a.target_ids, b.target_ids));
  CHECK(torch::equal(a.position_mask, b.position_mask));
  CHECK((a.target_p - b.target_p).abs().max().item<float>() < 1e-5);
}

TEST_CASE("target head rejects mismatched inputs", "[model][target]") {
  at::Tensor W = torch::randn({10, 4});
  CHECK_THROWS_WITH(TargetHead(W, torch::ones({9}, torch::kBool)), Catch::Contains("t2d"));
  TargetHead head(W, torch::ones({10}, torch::kBool));
  CHECK_THROWS_WITH(head.compute(torch::randn({1, 3, 5}), torch::ones({1, 3}), 1),
                    Catch::Contains("target_hidden"));
}

TEST_CASE("automatic vocabulary tiles are aligned and bounded", "[model][target]") {
  const int64_t limit = int64_t{16} << 20;
  for (int64_t rows : {1, 7, 1414, 1489, 2048, 4095, 8192, 16384, 100000}) {
    for (int64_t vocab : {1000, 32000, 128256, 151936}) {
      INFO("rows " << rows << ", vocab " << vocab);
      const int64_t tile = TargetHead::auto_vocab_tile(rows, vocab);
      CHECK(tile >= 1);
      CHECK(tile <= vocab);
      CHECK((tile == vocab || tile % 256 == 0));  // 1414 rows gave 11865 columns before
      CHECK((tile <= 1024 || rows * tile <= limit));
      CHECK((tile >= std::min<int64_t>(1024, vocab)));
    }
  }
  // The width that misaligned the logits' rows on the GPU (measured 2026-11-30): now a multiple
  // of 256 just below it.
  CHECK(TargetHead::auto_vocab_tile(1414, 128256) == 11776);
}
