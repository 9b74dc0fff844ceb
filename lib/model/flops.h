// Floating-point operation counts of one draft training step (forward + backward), for MFU.
// Model FLOPs: what the math needs, not what a kernel recomputes (flash recompute is excluded).
// Pure arithmetic on the config; never touches tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "model/draft_config.h"

namespace fsdp::model {

struct StepFlops {
  double forward = 0;      // draft forward: matmuls + attention, all T steps
  double backward = 0;     // draft backward: 2x each matmul with trainable weights, except fc
                           // (1x: its input needs no gradient); 2x attention
  double target_head = 0;  // target_p (Vd rows) + full-vocab argmax (V rows), forward only
  double attention = 0;    // attention part of forward (QK^T and PV; causal + diagonal)
  double total() const { return forward + backward + target_head; }
};

// One micro-batch of B sequences padded to S, ttt_length T. Causal attention counts the
// S(S+1)/2 visible key pairs per head, plus i diagonal keys per query at step i.
StepFlops count_step_flops(const DraftConfig& cfg, int64_t batch, int64_t seq, int64_t ttt_length);

// What fsdp-train executes: the draft lm_head of step i runs on head_rows[i] rows and the target
// head on head_rows[0] rows (the loss rows, see LossRows in ttt_loss.h) instead of all B*S.
// head_rows has ttt_length entries.
StepFlops count_step_flops(const DraftConfig& cfg, int64_t batch, int64_t seq, int64_t ttt_length,
                           const std::vector<int64_t>& head_rows);

// The same over sequences of the given lengths (the real tokens of each sample, or each document
// of a packed micro-batch): causal pairs are counted per sequence, padding not at all.
StepFlops count_step_flops(const DraftConfig& cfg, const std::vector<int64_t>& lengths,
                           int64_t ttt_length, const std::vector<int64_t>& head_rows);

}  // namespace fsdp::model
