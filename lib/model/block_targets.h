// Where a block draft's training blocks sit and what they are scored on (docs/model.md "Block
// drafts"): anchors drawn among the supervised positions of each sequence, the block tokens fed
// to the draft (the anchor's token, then the mask token), and the labels and weights of each block
// position. Pure tensor code over a micro-batch's host loss mask; no model, no distribution.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/dflash_model.h"

namespace fsdp::model {

// The anchor draw of one sequence: the key of its random stream (a hash of the run's seed and
// the epoch) and its subsequence (the sample's dataset index), so a sample draws the same
// anchors on any rank, micro-batch or resume.
struct AnchorStream {
  uint64_t key = 0;
  uint64_t subsequence = 0;
};
AnchorStream anchor_stream(uint64_t seed, int64_t epoch, int64_t sample_index);

// The anchors of one sequence of loss mask `mask` (S values 0/1): the candidates are the positions
// p < S - 1 with mask[p] and mask[p + 1] both set (the anchor's token is known and its first
// prediction is supervised); at most `num_anchors` of them, chosen as SpecForge chooses (each
// candidate gets a uniform random key, the smallest keys win: a uniformly random subset), in
// increasing order. Keys are 64-bit draws of the stream (Philox4x32-10), ties to the lower
// position.
std::vector<int64_t> draw_anchors(const int64_t* mask, int64_t S, int64_t num_anchors,
                                  const AnchorStream& stream);

// The blocks of a micro-batch: row b's anchors from draw_anchors (streams[b]), padded to the
// longest row's count with dropped blocks (anchor 0, keep false), as SpecForge pads them. Made on
// `device` from the host loss mask int64 [B, S]. A micro-batch without any candidate gets one
// dropped block per row (it scores nothing).
BlockLayout sample_blocks(const at::Tensor& loss_mask_host, int64_t num_anchors, int64_t block_size,
                          const std::vector<AnchorStream>& streams, c10::Device device);

// The block tokens [B, N * block_size]: each kept block's anchor token then mask tokens; a
// dropped block is all mask tokens. input_ids int64 [B, S] unshifted, on the layout's device.
at::Tensor block_input_ids(const at::Tensor& input_ids, const BlockLayout& layout,
                           int64_t mask_token_id);

// What DFlash scores: position k of a block predicts the token at anchor + k (k = 0 is the anchor
// itself and weighs 0). target_ids int64 [B, N, bs]; weight float [B, N, bs] = kept block *
// (anchor + k < S) * (k > 0) * loss_mask[anchor + k], before any decay.
struct BlockLabels {
  at::Tensor target_ids;
  at::Tensor weight;
};
BlockLabels dflash_labels(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                          const BlockLayout& layout);

}  // namespace fsdp::model
