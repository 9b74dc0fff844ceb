// LoRA adaptation of a draft (docs/model.md "LoRA"): adapters on the chosen projections of every
// layer, everything else frozen, the adapted draft starting equal to its base, and the merged
// weights (what a checkpoint exports) computing the adapted draft's logits.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/draft_model.h"
#include "model/ttt_loss.h"
#include "support/small_draft.h"

using namespace fsdp::model;

namespace {

DraftConfig config(int64_t layers) {
  DraftConfig c = fsdp::testing::small_draft();
  c.num_hidden_layers = layers;
  c.fc_norm = layers > 1;
  c.validate();
  return c;
}

struct Inputs {
  at::Tensor ids, mask, aux;
};

Inputs inputs(const DraftConfig& c, at::ScalarType dtype) {
  torch::manual_seed(3);
  return {torch::randint(0, c.vocab_size, {2, 6}, torch::kLong),
          torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, torch::kLong).view({2, 6}),
          torch::randn({2, 6, c.fc_in_features()}).to(dtype)};
}

std::map<std::string, at::Tensor> state(const Eagle3Draft& m) {
  std::map<std::string, at::Tensor> s;
  for (const auto& p : m->named_parameters()) s[p.key()] = p.value().detach().clone();
  return s;
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm()).item<double>();
}

}  // namespace

TEST_CASE("LoRA: adapters on the targets of every layer, everything else frozen", "[model][lora]") {
  Eagle3Draft m(config(2));
  m->enable_lora(4, 8.0, {LoraTarget::kQProj, LoraTarget::kVProj, LoraTarget::kDownProj});
  CHECK(m->lora_enabled());
  std::vector<std::string> trained;
  for (const auto& p : m->named_parameters())
    if (p.value().requires_grad()) trained.push_back(p.key());
  CHECK(trained ==
        std::vector<std::string>{
            "layers.0.self_attn.q_proj.lora_A.weight", "layers.0.self_attn.q_proj.lora_B.weight",
            "layers.0.self_attn.v_proj.lora_A.weight", "layers.0.self_attn.v_proj.lora_B.weight",
            "layers.0.mlp.down_proj.lora_A.weight", "layers.0.mlp.down_proj.lora_B.weight",
            "layers.1.self_attn.q_proj.lora_A.weight", "layers.1.self_attn.q_proj.lora_B.weight",
            "layers.1.self_attn.v_proj.lora_A.weight", "layers.1.self_attn.v_proj.lora_B.weight",
            "layers.1.mlp.down_proj.lora_A.weight", "layers.1.mlp.down_proj.lora_B.weight"});
  auto params = m->named_parameters();
  CHECK(params["layers.0.self_attn.q_proj.lora_A.weight"].sizes() == at::IntArrayRef({4, 32}));
  CHECK(params["layers.1.self_attn.q_proj.lora_A.weight"].sizes() == at::IntArrayRef({4, 16}));
  CHECK(params["layers.0.mlp.down_proj.lora_B.weight"].sizes() == at::IntArrayRef({16, 4}));
  CHECK(m->trainable_parameters().size() == trained.size());
  // Bad values are refused (an unknown target name is refused where --lora-targets is parsed:
  // tests/unit/config).
  Eagle3Draft other(config(1));
  CHECK_THROWS_AS(other->enable_lora(4, 8.0, {}), fsdp::UsageError);
  CHECK_THROWS_AS(other->enable_lora(0, 8.0, {LoraTarget::kQProj}), fsdp::UsageError);
  CHECK_THROWS_AS(other->enable_lora(4, 0.0, {LoraTarget::kQProj}), fsdp::UsageError);
}

TEST_CASE("LoRA: the adapted draft starts as its base; gradients reach the adapters only",
          "[model][lora]") {
  const DraftConfig c = config(1);
  torch::manual_seed(1);
  Eagle3Draft base(c);
  torch::manual_seed(1);
  Eagle3Draft m(c);
  m->enable_lora(4, 8.0, all_lora_targets());
  const Inputs in = inputs(c, at::kFloat);
  const auto a = ttt_logits(*base, in.ids, in.mask, in.aux, 3, AttentionImpl::kEfficient);
  const auto b = ttt_logits(*m, in.ids, in.mask, in.aux, 3, AttentionImpl::kEfficient);
  for (size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));  // B starts at zero
  TargetDistribution target;
  target.target_p = torch::rand({2, 9, c.draft_vocab()});
  target.target_p /= target.target_p.sum(-1, true);
  target.position_mask = in.mask.clone();
  LossOptions opt;
  opt.ttt_length = 3;
  ttt_step(*m, target, in.ids, in.mask, in.mask, in.aux, opt).loss.backward();
  for (const auto& p : m->named_parameters()) {
    INFO(p.key());
    const bool adapter = p.key().find(".lora_") != std::string::npos;
    CHECK(p.value().grad().defined() == adapter);
    // B starts at zero, so A's first gradient is zero too; B's is not.
    if (p.key().find(".lora_B.") != std::string::npos)
      CHECK(p.value().grad().abs().max().item<float>() > 0);
  }
}

TEST_CASE("LoRA: the merged weights compute the adapted draft (float32 1e-6, float64 1e-12)",
          "[model][lora]") {
  for (int64_t layers : {1, 2}) {
    for (auto dtype : {at::kFloat, at::kDouble}) {
      INFO(layers << " layer(s), " << (dtype == at::kFloat ? "float32" : "float64"));
      const DraftConfig c = config(layers);
      torch::manual_seed(2);
      Eagle3Draft m(c);
      m->enable_lora(4, 8.0, all_lora_targets());
      m->to(dtype);
      {
        torch::NoGradGuard g;  // adapters as training would leave them: B no longer zero
        for (const auto& p : m->named_parameters())
          if (p.key().find(".lora_") != std::string::npos) p.value().uniform_(-0.3, 0.3);
      }
      const Inputs in = inputs(c, dtype);
      const auto adapted = ttt_logits(*m, in.ids, in.mask, in.aux, 3, AttentionImpl::kEfficient);
      auto merged = state(m);
      const size_t before = merged.size();
      CHECK(merge_lora(merged, 2.0) == 7 * layers);
      CHECK(merged.size() == before - 14 * static_cast<size_t>(layers));
      Eagle3Draft plain(c);
      plain->to(dtype);
      {
        torch::NoGradGuard g;
        for (auto& p : plain->named_parameters()) p.value().copy_(merged.at(p.key()));
      }
      const auto got = ttt_logits(*plain, in.ids, in.mask, in.aux, 3, AttentionImpl::kEfficient);
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("step " << i);
        CHECK(rel(got[i], adapted[i]) < (dtype == at::kFloat ? 1e-6 : 1e-12));
      }
      // And they differ from the base: the adapters are not a no-op.
      CHECK(rel(merged.at(c.num_hidden_layers == 1 ? "midlayer.self_attn.q_proj.weight"
                                                   : "layers.1.self_attn.q_proj.weight"),
                state(m).at(c.num_hidden_layers == 1 ? "midlayer.self_attn.q_proj.weight"
                                                     : "layers.1.self_attn.q_proj.weight")) > 1e-3);
    }
  }
  std::map<std::string, at::Tensor> broken{{"x.lora_A.weight", torch::zeros({2, 3})},
                                           {"x.weight", torch::zeros({4, 3})}};
  CHECK_THROWS_WITH(merge_lora(broken, 1.0), Catch::Contains("x.lora_B.weight"));
}

TEST_CASE("LoRA: a rank above min(in, out) of a target is refused naming both numbers",
          "[model][lora]") {
  const DraftConfig c = config(3);
  // The shapes the check uses are the ones every layer is built with ("layers.<k>.").
  Eagle3Draft m(c);
  int64_t checked = 0;
  for (const auto& p : m->named_parameters()) {
    const std::string& name = p.key();
    const int64_t layer = name.rfind("layers.", 0) == 0 ? std::stoll(name.substr(7)) : 0;
    for (const LoraTarget t : all_lora_targets()) {
      if (name.find("." + std::string(lora_target_name(t)) + ".weight") == std::string::npos)
        continue;
      INFO(name);
      const ProjectionShape s = projection_shape(c, t, layer);
      CHECK(p.value().size(0) == s.out);
      CHECK(p.value().size(1) == s.in);
      ++checked;
    }
  }
  CHECK(checked == 3 * static_cast<int64_t>(all_lora_targets().size()));
  // small_draft: k_proj and v_proj are 32 -> 8 (16 -> 8 after layer 0), every other projection
  // has min(in, out) 16.
  check_lora_rank(c, 8, {LoraTarget::kKProj, LoraTarget::kVProj});
  check_lora_rank(c, 16,
                  {LoraTarget::kQProj, LoraTarget::kOProj, LoraTarget::kGateProj,
                   LoraTarget::kUpProj, LoraTarget::kDownProj});
  const auto refused = [](const DraftConfig& cfg, int64_t rank,
                          const std::vector<LoraTarget>& targets, const std::string& projection,
                          const std::string& limit) {
    try {
      check_lora_rank(cfg, rank, targets);
      FAIL("rank " << rank << " was accepted");
    } catch (const fsdp::UsageError& e) {
      const std::string text = e.message() + " | " + e.hint();
      INFO(text);
      CHECK(text.find("--lora-rank " + std::to_string(rank)) != std::string::npos);
      CHECK(text.find("= " + limit) != std::string::npos);
      CHECK(text.find(projection) != std::string::npos);
    }
  };
  refused(c, 9, {LoraTarget::kQProj, LoraTarget::kKProj}, "k_proj", "8");
  refused(c, 17, {LoraTarget::kDownProj}, "down_proj", "16");
  // Wider attention (4 heads of 8 over H 16): q_proj is 32 -> 32 in layer 0 but 16 -> 32 in
  // every later layer, which sets the limit of a deeper draft.
  DraftConfig wide = config(1);
  wide.head_dim = 8;
  wide.validate();
  check_lora_rank(wide, 32, {LoraTarget::kQProj});
  wide.num_hidden_layers = 3;
  wide.fc_norm = true;
  wide.validate();
  refused(wide, 17, {LoraTarget::kQProj}, "layer 1", "16");
}
