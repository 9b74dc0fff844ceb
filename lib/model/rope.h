// Rotary position embedding (rotate-half form) with default, linear, llama3 and yarn frequency
// scaling, computed in fp32 as HF transformers does. Tables only: never holds model weights.
#pragma once

#include <ATen/core/Tensor.h>

#include "model/draft_config.h"

namespace fsdp::model {

// inv_freq [d/2] fp32 on CPU and the attention scaling that multiplies cos/sin (1 except yarn).
struct RopeFrequencies {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};
RopeFrequencies rope_frequencies(const DraftConfig& cfg);

// cos/sin tables [P, d] (fp32; float64 requests get float64 tables) for positions 0..P-1, grown on
// demand. Starts with max_position_embeddings + ttt_length positions (positions t+i of the TTT
// unroll).
class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  RotaryEmbedding(const DraftConfig& cfg, int64_t initial_positions);

  // cos and sin rows for positions offset..offset+len-1, [len, d], cast to `dtype` and moved to
  // `device` (cached per device/dtype until the table grows).
  std::pair<at::Tensor, at::Tensor> slice(int64_t offset, int64_t len, c10::ScalarType dtype,
                                          c10::Device device);
  int64_t positions() const { return cos_.defined() ? cos_.size(0) : 0; }
  const RopeFrequencies& frequencies() const { return freqs_; }

 private:
  void grow(int64_t positions);
  RopeFrequencies freqs_;
  at::Tensor cos_, sin_;      // fp32 CPU master tables
  at::Tensor cos64_, sin64_;  // float64 tables, used only when float64 is requested (tests)
  at::Tensor cos_cached_, sin_cached_;  // last requested device/dtype copy
};

// x [B, heads, S, d] rotated with cos/sin [S, d]: x*cos + rotate_half(x)*sin, where
// rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace fsdp::model
