// --draft-init normal (Hugging Face's post_init, what SpecForge's drafts start from): every
// matrix but the embedding drawn from N(0, initializer_range), norms at 1, the embedding left for
// the target's copy; initializer_range read from the draft config and checked.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/draft_config.h"
#include "model/draft_model.h"
#include "support/small_draft.h"

using namespace fsdp::model;

TEST_CASE("normal_init draws every matrix from N(0, std) and keeps norms at 1", "[model]") {
  DraftConfig c = fsdp::testing::small_draft();
  c.hidden_size = 64;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.vocab_size = 256;
  c.draft_vocab_size = 128;
  c.num_hidden_layers = 2;
  c.fc_norm = true;
  c.validate();
  torch::manual_seed(3);
  Eagle3Draft d(c);
  const at::Tensor embed_before = d->named_parameters()["embed_tokens.weight"].clone();
  d->normal_init(0.05);
  int matrices = 0;
  for (const auto& p : d->named_parameters()) {
    const at::Tensor w = p.value().to(at::kDouble);
    INFO(p.key());
    if (p.key() == "embed_tokens.weight") {
      CHECK(at::equal(p.value(), embed_before));
    } else if (w.dim() == 2) {
      ++matrices;
      // n >= 4096 draws: the sample std is within 5% of 0.05 (about 4.4 standard errors).
      CHECK(std::fabs(w.std().item<double>() / 0.05 - 1) < 0.05);
      CHECK(std::fabs(w.mean().item<double>()) < 0.05 * 5 / std::sqrt(double(w.numel())));
    } else {
      CHECK(at::equal(p.value(), at::ones_like(p.value())));
    }
  }
  // fc, lm_head, and q/k/v/o/gate/up/down of each of the 2 layers.
  CHECK(matrices == 2 + 2 * 7);
  REQUIRE_THROWS_AS(d->normal_init(0.0), fsdp::Error);
}

TEST_CASE("initializer_range comes from the draft config", "[model]") {
  const nlohmann::json base = {{"architectures", {"LlamaForCausalLMEagle3"}},
                               {"hidden_size", 16},
                               {"intermediate_size", 24},
                               {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},
                               {"vocab_size", 40},
                               {"max_position_embeddings", 16}};
  CHECK(parse_draft_config(base.dump(), "d.json").initializer_range == 0.02);
  nlohmann::json j = base;
  j["initializer_range"] = 0.01;
  const DraftConfig c = parse_draft_config(j.dump(), "d.json");
  CHECK(c.initializer_range == 0.01);
  // Carried into the export as given.
  CHECK(nlohmann::json::parse(c.to_json())["initializer_range"] == 0.01);
  j["initializer_range"] = -1;
  REQUIRE_THROWS_AS(parse_draft_config(j.dump(), "d.json"), fsdp::UsageError);
}
