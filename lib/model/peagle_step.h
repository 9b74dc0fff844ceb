// One P-EAGLE training (or evaluation) micro-batch (docs/model.md "P-EAGLE"): the parallel
// drafting forward of every depth, the soft cross-entropy against the target on the rows the
// depth sampling kept, and the metric sums. As SpecForge 0.2.0's OnlinePEagleModel and
// compute_peagle_metrics compute them, per sample.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/peagle_model.h"
#include "model/peagle_sampling.h"
#include "model/target_head.h"
#include "model/ttt_attention.h"

namespace fsdp::model {

// A micro-batch in the EAGLE3 (shifted) layout: input_ids and target_hidden shifted left by one
// (the row at position p reads the token after p and is taught the target's distribution for
// the token after that), loss_mask and aux_hidden as dumped. On the device.
struct PEagleInputs {
  at::Tensor input_ids;       // int64 [B, S]
  at::Tensor attention_mask;  // int64 [B, S], right-padded
  at::Tensor loss_mask;       // int64 [B, S]
  at::Tensor aux_hidden;      // [B, S, n * Ht]
  at::Tensor target_hidden;   // [B, S, Ht]
  at::Tensor host_loss_mask;  // int64 [B, S] on the host (which rows reach the vocabulary)
};

struct PEagleStepOptions {
  int64_t mask_token_id = 0;
  // The loss is the mean over the micro-batch's samples of each sample's weighted mean, divided
  // by this (the micro-batches of the optimizer step).
  double divisor = 1.0;
  int64_t head_chunk_rows = 4096;  // rows of the vocabulary projection computed at once
  // Evaluation: every kept row reaches the vocabulary, loss position or not, and its hit is
  // reported (PEagleStepOutput::hits) for the engine's walk; the loss and metrics still weigh
  // only the loss positions.
  bool all_rows = false;
  AttentionImpl impl = AttentionImpl::kEfficient;
};

struct PEagleStepOutput {
  at::Tensor loss;  // scalar: what backward runs
  // float64 on the device: per depth d < depths, the kept rows with a loss weight (loss_mask at
  // a + d and the target's top-1 token in the draft vocabulary) and those whose draft argmax is
  // the target's; and per sample its weighted mean loss and weight sum (SpecForge's loss_num /
  // loss_den), detached.
  at::Tensor depth_total, depth_correct;  // [depths]
  at::Tensor sample_loss, sample_weight;  // [B]
  // all_rows only: int64 [B, depths, S], at (b, d, a) 1 when row (a, d)'s argmax, mapped through
  // d2t, is the target's full-vocabulary argmax at a + d, 0 when not, -1 where no row was kept.
  at::Tensor hits;
};

// Every row of depths 0 .. depths-1 whose position a + d is inside the sample (evaluation).
CodRows dense_rows(int64_t seq_len, int64_t depths);

// rows[b]: sample b's depth sampling (cod_sample). depths: the metric width (num_depths).
PEagleStepOutput peagle_step(PEagleDraftImpl& draft, const TargetHead& head, const PEagleInputs& in,
                             const std::vector<CodRows>& rows, int64_t depths,
                             const PEagleStepOptions& opt);

}  // namespace fsdp::model
