// DSpark's heads over the DFlash backbone's output (SpecForge 0.2.0 DSparkDraftModel): the Markov
// head, a low-rank logit bias from the previous token (vanilla; gated by the hidden state; or a
// recurrence unrolled inside each block), and the confidence head, one logit per position that
// predicts the block's acceptance. State-dict names are SpecForge's (and, for the vanilla head
// and the confidence head, what vLLM's qwen3_dspark loader reads). Knows nothing about the
// backbone, the loss or distribution.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "model/dspark_heads_config.h"

namespace fsdp::model {

// SpecForge's `.float()` where the DSpark code upcasts: fp32, but fp64 stays fp64 (so double
// precision checks of the same code are possible).
at::Tensor dspark_float(const at::Tensor& x);

// markov_head.*: markov_w1.weight [V, r] (an embedding of the previous token), markov_w2.weight
// [V, r] (no bias); gated adds gate_proj.{weight [r, H + r], bias [r]}, rnn adds
// joint_proj.{weight [3r, 2r + H], bias [3r]}.
class MarkovHeadImpl : public torch::nn::Module {
 public:
  explicit MarkovHeadImpl(const DSparkHeadsConfig& cfg);
  // markov_w1 of token ids [...] -> [..., r].
  at::Tensor embed(const at::Tensor& token_ids);
  // base_logits [..., bs, V] plus the bias of each position from prev_token_ids [..., bs] (the
  // token before each position) and hidden [..., bs, H]. vanilla: w2(w1(prev)); gated:
  // w2(sigmoid(gate_proj([hidden, w1(prev)])) * w1(prev)); rnn: from a zero state s per block,
  // position k: [g, c, o] = joint_proj([s, w1(prev_k), hidden_k]) split in three,
  // s = sigmoid(g) s + (1 - sigmoid(g)) tanh(c), bias_k = w2(tanh(o)).
  at::Tensor apply_block(const at::Tensor& base_logits, const at::Tensor& prev_token_ids,
                         const at::Tensor& hidden);

  MarkovHeadType type;
  int64_t rank;
  torch::nn::Embedding markov_w1{nullptr};
  torch::nn::Linear markov_w2{nullptr};
  torch::nn::Linear gate_proj{nullptr};   // gated only
  torch::nn::Linear joint_proj{nullptr};  // rnn only

 private:
  at::Tensor rnn_block(const at::Tensor& base_logits, const at::Tensor& prev_token_ids,
                       const at::Tensor& hidden);
};
TORCH_MODULE(MarkovHead);

// confidence_head.proj.{weight [1, in], bias [1]}: in = H, or H + r with
// confidence_head_with_markov (vLLM's DSparkConfidenceHead: the same names, bias on).
class ConfidenceHeadImpl : public torch::nn::Module {
 public:
  explicit ConfidenceHeadImpl(int64_t input_dim);
  at::Tensor forward(const at::Tensor& features);  // [..., in] -> [..., ]
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(ConfidenceHead);

// The heads a DSpark draft adds; either may be absent (markov_rank 0, no confidence head).
// named_parameters() gives SpecForge's state-dict names (markov_head.markov_w1.weight, ...,
// confidence_head.proj.bias): a draft module registers markov_head and confidence_head at its
// top level (or exports these names as they are).
//
// Initialisation: Hugging Face's post_init, which SpecForge's draft runs: every weight drawn
// from N(0, initializer_range), every bias zero, in named_parameters() order from LibTorch's
// default generator (seed it with torch::manual_seed for a reproducible draw). SpecForge draws
// in its module order after the backbone's parameters from Python's generator, so the same seed
// gives the same distribution, not the same values.
class DSparkHeadsImpl : public torch::nn::Module {
 public:
  explicit DSparkHeadsImpl(const DSparkHeadsConfig& cfg);

  const DSparkHeadsConfig& config() const { return cfg_; }
  bool has_markov_head() const { return !markov_head.is_empty(); }
  bool has_confidence_head() const { return !confidence_head.is_empty(); }

  // The draft's logits: base_logits4d [B, N, bs, V] (the target lm_head over the backbone's
  // hidden4d [B, N, bs, H]) with the Markov bias from prev_token_ids [B, N, bs] (int64; the
  // token before each block position: the anchor's token, then the labels); base_logits4d
  // itself without a Markov head. Any leading dimensions work, as long as the three agree.
  at::Tensor apply_logits_head(const at::Tensor& base_logits4d, const at::Tensor& prev_token_ids,
                               const at::Tensor& hidden4d);

  // Confidence logits, fp32 [B, N, bs], from hidden4d (and the Markov embedding of
  // prev_token_ids with confidence_head_with_markov); an undefined tensor without a confidence
  // head.
  at::Tensor predict_confidence(const at::Tensor& hidden4d, const at::Tensor& prev_token_ids);

  // Draws every parameter again as the constructor does (N(0, std) weights, zero biases).
  void reset_parameters(double std);

  MarkovHead markov_head{nullptr};
  ConfidenceHead confidence_head{nullptr};

 private:
  DSparkHeadsConfig cfg_;
};
TORCH_MODULE(DSparkHeads);

}  // namespace fsdp::model
