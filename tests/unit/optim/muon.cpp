// Muon's pieces (optim/muon.h): speculators' parameter split on the EAGLE3 and block drafts'
// names and shapes, the learning-rate adjustments, Newton-Schulz's output (near-orthogonal rows
// of the orientation it was given, bfloat16), and the option checks. torch.optim.Muon itself is
// the reference of e2e.torch_muon.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "optim/muon.h"

using namespace fsdp::optim;

TEST_CASE("muon: speculators' parameter split", "[optim][muon]") {
  CHECK(muon_group("midlayer.self_attn.q_proj.weight", {4096, 8192}) == MuonGroup::kMuon);
  CHECK(muon_group("fc.weight", {4096, 12288}) == MuonGroup::kMuon);
  CHECK(muon_group("layers.1.mlp.down_proj.weight", {4096, 14336}) == MuonGroup::kMuon);
  CHECK(muon_group("lm_head.weight", {32000, 4096}) == MuonGroup::kAdamWAtMuonLr);
  CHECK(muon_group("embed_tokens.weight", {128256, 4096}) == MuonGroup::kAdamWAtMuonLr);
  CHECK(muon_group("markov_head.markov_w1.weight", {16, 4096}) == MuonGroup::kAdamWAtMuonLr);
  CHECK(muon_group("norm.weight", {4096}) == MuonGroup::kAdamW);
  CHECK(muon_group("midlayer.self_attn.q_norm.weight", {128}) == MuonGroup::kAdamW);
  CHECK(muon_group("confidence_head.weight", {1, 4096}) == MuonGroup::kAdamW);  // [1, N]
  CHECK(muon_group("mask_hidden.weight", {1, 1, 12288}) == MuonGroup::kAdamW);  // 3-D
}

TEST_CASE("muon: learning-rate adjustments", "[optim][muon]") {
  CHECK(muon_adjusted_lr(0.02, MuonAdjustLr::kMatchRmsAdamW, 4096, 14336) ==
        Approx(0.02 * 0.2 * std::sqrt(14336.0)));
  CHECK(muon_adjusted_lr(0.02, MuonAdjustLr::kOriginal, 14336, 4096) ==
        Approx(0.02 * std::sqrt(14336.0 / 4096.0)));
  CHECK(muon_adjusted_lr(0.02, MuonAdjustLr::kOriginal, 4096, 14336) == Approx(0.02));
}

TEST_CASE("muon: Newton-Schulz gives near-orthogonal rows, either orientation", "[optim][muon]") {
  torch::manual_seed(1);
  for (auto shape : {std::vector<int64_t>{16, 48}, std::vector<int64_t>{48, 16}}) {
    const at::Tensor g = torch::randn(shape);
    const at::Tensor o = newton_schulz(g, MuonOptions{}.ns_coefficients, 5, 1e-7);
    CHECK(o.scalar_type() == at::kBFloat16);
    CHECK(o.sizes() == g.sizes());
    const at::Tensor small = shape[0] < shape[1] ? o.to(at::kFloat) : o.to(at::kFloat).t();
    // Singular values land in roughly (0.5, 1.5) (torch's note on the quintic): the Gram
    // matrix's diagonal near 1, its off-diagonal small.
    const at::Tensor gram = at::matmul(small, small.t());
    const at::Tensor diag = gram.diagonal();
    CHECK(diag.min().item<float>() > 0.25f);
    CHECK(diag.max().item<float>() < 2.25f);
    CHECK((gram - at::diag(diag)).abs().max().item<float>() < 0.5f);
  }
  // A zero gradient stays zero (eps keeps the division finite).
  const at::Tensor z = newton_schulz(torch::zeros({4, 6}), MuonOptions{}.ns_coefficients, 5, 1e-7);
  CHECK(z.abs().max().item<float>() == 0.0f);
}

TEST_CASE("muon: option checks name the option", "[optim][muon]") {
  auto refused = [](MuonOptions o, const std::string& name) {
    try {
      o.validate();
      FAIL("accepted");
    } catch (const fsdp::UsageError& e) {
      CHECK(std::string(e.what()).find(name) != std::string::npos);
    }
  };
  MuonOptions o;
  o.momentum = 1.0;
  refused(o, "momentum");
  o = MuonOptions{};
  o.ns_steps = 100;
  refused(o, "ns-steps");
  o = MuonOptions{};
  o.weight_decay = -1;
  refused(o, "weight-decay");
  MuonOptions{}.validate();
}
