// DSpark's objective over one set of draft blocks (SpecForge 0.2.0 OnlineDSparkModel): the block
// labels and evaluation mask, the previous tokens the Markov head reads, the position-decayed
// loss weights, the target state aligned with each label, and the additive terms of the loss
// (cross-entropy, the L1 distance between draft and target distributions, the confidence head's
// loss against the detached acceptance) and of the metrics, over chunks of blocks whose logits
// are never held whole. The loss is the terms over a denominator handed in: this file knows
// nothing of ranks, the backbone or the sampler that drew the anchors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "model/dspark_heads.h"

namespace fsdp::model {

// What each block position is scored against. Block j of sample b starts at anchor a = anchors[b,
// j]; position k (0..bs-1) predicts the token at a + 1 + k.
struct DSparkBlockLabels {
  at::Tensor target_ids;          // int64 [B, N, bs]: input_ids at a + 1 + k (clamped to S - 1)
  at::Tensor eval_mask;           // bool [B, N, bs]: scored positions (see dspark_block_labels)
  at::Tensor safe_label_indices;  // int64 [B, N, bs]: min(a + 1 + k, S - 1), 0 in dropped blocks
};

// input_ids int64 [B, S], loss_mask [B, S] (any number type; > 0.5 is supervised), anchors int64
// [B, N] and keep_mask bool [B, N] (the blocks drawn; a dropped block's anchor is 0) as the
// anchor sampler returns them. A position is scored while every position before it in the block
// is: its label lies inside the sequence, is supervised, and the block is kept (a cumulative
// product along the block).
DSparkBlockLabels dspark_block_labels(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                                      const at::Tensor& anchors, const at::Tensor& keep_mask,
                                      int64_t block_size);

// The token before each block position: the anchor's token, then the block's labels (int64
// [B, N, bs]).
at::Tensor dspark_prev_token_ids(const at::Tensor& input_ids, const at::Tensor& anchors,
                                 const at::Tensor& target_ids);

// fp32 [B, N, bs]: eval_mask as 0/1, times exp(-k / gamma) at block position k (from 0) when
// gamma is given and > 0 (loss_decay_gamma; absent or <= 0: no decay).
at::Tensor dspark_loss_weights(const at::Tensor& eval_mask, std::optional<double> gamma);

// The target's last hidden state that predicts each label: target_last_hidden [B, S, H] at
// max(safe_label_indices - 1, 0) -> [B, N, bs, H].
at::Tensor dspark_aligned_target_hidden(const at::Tensor& target_last_hidden,
                                        const at::Tensor& safe_label_indices);

// The three weights of the loss (training.dspark_*_alpha; SpecForge's defaults), each >= 0.
struct DSparkAlphas {
  double ce = 0.1;
  double l1 = 0.9;
  double confidence = 1.0;
  void validate() const;  // UsageError naming the training key of a negative alpha
};

// Whether the objective reads the target's aligned state: with l1 > 0, or with a confidence head
// and confidence > 0 (SpecForge then requires target_last_hidden_states).
bool dspark_needs_target(const DSparkHeads& heads, const DSparkAlphas& alphas);

// One set of blocks. hidden4d [B, N, bs, H] is the backbone's output (the draft's norm applied);
// lm_head_weight [V, H] the target's frozen LM head (no gradient is taken for it).
struct DSparkObjectiveInputs {
  at::Tensor hidden4d;
  at::Tensor prev_token_ids;  // int64 [B, N, bs]
  at::Tensor target_ids;      // int64 [B, N, bs]
  at::Tensor eval_mask;       // bool [B, N, bs]
  at::Tensor loss_weights;    // fp32 [B, N, bs] (dspark_loss_weights)
  // [B, N, bs, H] or undefined; read only when dspark_needs_target (an error if then missing).
  at::Tensor aligned_target_hidden;
  at::Tensor lm_head_weight;
};

// The additive terms (sums over the blocks given; add them over chunks, micro-batches, ranks).
// ce_num, l1_num and confidence_num carry the graph to hidden4d and the heads' parameters; every
// other term is detached. Terms a configuration does not compute are zeros: l1_num without l1
// alpha, confidence_* without a confidence head or its alpha, teacher_* and tau_* when the target
// is not read (has_target false; SpecForge then logs no such metrics).
struct DSparkTerms {
  at::Tensor ce_num;                 // sum w * CE(draft logits, label)
  at::Tensor l1_num;                 // sum w * |softmax(draft) - softmax(target)|_1
  at::Tensor confidence_num;         // sum w * BCE(confidence logit, acceptance)
  at::Tensor confidence_error_num;   // sum w * |sigmoid(confidence logit) - acceptance|
  at::Tensor correct_num;            // scored positions whose draft argmax is the label
  at::Tensor eval_den;               // scored positions
  at::Tensor ce_position_num;        // [bs]: sum over scored positions of CE, per block position
  at::Tensor correct_position_num;   // [bs]
  at::Tensor position_den;           // [bs]
  at::Tensor teacher_agreement_num;  // scored positions whose draft argmax is the target's
  at::Tensor teacher_top1_num;       // sum over scored positions of the target's top probability
  at::Tensor draft_top1_num;         // the same for the draft
  at::Tensor tau_num;  // sum over blocks with a scored position of 1 + sum_k prod_{i<=k} accept_i
  at::Tensor tau_den;  // blocks with a scored position
  bool has_target = false;
};

// The terms of one set of blocks. chunk_blocks 0 runs every block at once; chunk_blocks > 0 runs
// slices of that many blocks (dim 1), summing their terms in order, so the [B, N, bs, V] logits
// are never held whole. When a gradient is wanted, each slice's gradient of the loss's own
// combination (alphas.ce * ce_num + alphas.l1 * l1_num + alphas.confidence * confidence_num) is
// taken as the slice is computed, and backward scales it by the factor the loss applied
// (dspark_loss): no slice's logits are formed twice, where SpecForge's checkpointed_chunk_reduce
// forms them again in backward; the memory kept is one gradient the size of hidden4d. Seeds in
// another proportion rerun each slice in backward with them. Values and gradients equal the
// unchunked ones within rounding. A sharding engine brackets this call as one use of the head
// units (the heads' parameters are read while it runs), whose outputs are the three
// differentiable terms.
// When `accepted_blocks` is given (evaluation), each chunk's accepted counts are appended in
// block order, once (a rerun in backward appends nothing): int64 [B, chunk] = accepted_prefix from
// position 0 of (draft argmax
// == target_ids & eval_mask), what a serving engine accepts of the block drafted greedily from its
// anchor (docs/block-drafts.md "DSpark").
DSparkTerms dspark_objective(DSparkHeads& heads, const DSparkObjectiveInputs& in,
                             const DSparkAlphas& alphas, int64_t chunk_blocks,
                             std::vector<at::Tensor>* accepted_blocks = nullptr);

// The loss: scale * (ce * ce_num + l1 * l1_num + confidence * confidence_num) / loss_den, where
// loss_den is the global sum of the loss weights (over every rank's blocks: the trainer's
// normaliser) and scale what the caller's gradient averaging needs (SpecForge multiplies by the
// world size because DDP averages gradients over ranks). loss_den <= 0 is an error (no
// supervised target token anywhere).
at::Tensor dspark_loss(const DSparkTerms& terms, const DSparkAlphas& alphas,
                       const at::Tensor& loss_den, double scale = 1.0);

}  // namespace fsdp::model
