// Test helper: the draft's logits of every TTT step for given weights and inputs, so a script can
// compare fsdp-train's model with another implementation of it (tests/e2e/specforge_modeling.sh
// runs SpecForge's own modeling code on the same weights). Never used outside tests.
//
//   draft_logits CONFIG.json WEIGHTS.safetensors INPUTS.safetensors OUT.safetensors T
//
// WEIGHTS: the draft's state dict under its export names (embed_tokens.weight included; d2t/t2d
// ignored). INPUTS: input_ids int64 [B,S], attention_mask int64 [B,S], aux float [B,S,n*Ht].
// OUT: logits_<i> [B,S,Vd] for i < T, computed in the dtype of aux (float32 or float64) with the
// efficient attention.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/draft_config.h"
#include "model/draft_model.h"
#include "model/ttt_loss.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: draft_logits CONFIG.json WEIGHTS.safetensors INPUTS.safetensors "
                 "OUT.safetensors T\n");
    return 2;
  }
  try {
    using namespace fsdp;
    const model::DraftConfig cfg = model::load_draft_config(argv[1]);
    model::Eagle3Draft draft(cfg);
    auto weights = checkpoint::SafetensorsFile::open(argv[2]);
    auto inputs = checkpoint::SafetensorsFile::open(argv[3]);
    const at::Tensor aux = inputs->read("aux");
    draft->to(aux.scalar_type());
    {
      at::NoGradGuard guard;
      for (auto& p : draft->named_parameters()) p.value().copy_(weights->read(p.key()));
    }
    const int64_t T = std::stoll(argv[5]);
    at::NoGradGuard guard;
    const auto logits =
        model::ttt_logits(*draft, inputs->read("input_ids"), inputs->read("attention_mask"), aux, T,
                          model::AttentionImpl::kEfficient);
    checkpoint::NamedTensors out;
    for (int64_t i = 0; i < T; ++i)
      out.emplace_back("logits_" + std::to_string(i), logits[static_cast<size_t>(i)]);
    checkpoint::write_safetensors(argv[4], out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "draft_logits: %s\n", e.what());
    return 1;
  }
}
