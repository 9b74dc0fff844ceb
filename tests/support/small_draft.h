// The small draft the model tests share (not validated: tests add their variant keys, then call
// validate()): H 16, 4 heads of dimension 4 over 2 KV heads, I 24, V 40, Vd 20, eps 1e-5, 16
// positions.
#pragma once

#include "model/draft_config.h"

namespace fsdp::testing {

inline model::DraftConfig small_draft() {
  model::DraftConfig c;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.intermediate_size = 24;
  c.vocab_size = 40;
  c.draft_vocab_size = 20;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 16;
  return c;
}

}  // namespace fsdp::testing
