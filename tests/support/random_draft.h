// Random weights for a draft under test: every matrix but the (frozen) embedding uniform in
// [-range, range], the norms in [0.5, 1.5] (they start at ones, where a wrong one would not show).
#pragma once

#include <torch/torch.h>

#include <string>

#include "model/draft_model.h"

namespace fsdp::testing {

inline void randomise_draft(model::Eagle3Draft& m, double range = 0.5) {
  torch::NoGradGuard g;
  for (const auto& kv : m->named_parameters()) {
    if (kv.key().find("norm") != std::string::npos)
      kv.value().uniform_(0.5, 1.5);
    else if (kv.key() != "embed_tokens.weight")
      kv.value().uniform_(-range, range);
  }
}

}  // namespace fsdp::testing
