// One DSpark step over a micro-batch of blocks (docs/block-drafts.md "DSpark"), composed as
// SpecForge 0.2.0's OnlineDSparkModel.forward composes it: the backbone over the block tokens and
// the context features, the blocks' labels and previous tokens, the position-decayed loss
// weights, the target state aligned with each label, and the heads' objective. What the trainer's
// DSpark algorithm (train/algo/dspark.h) runs and what the comparison with SpecForge's whole
// model (tests/tools/dspark_objective) runs. Knows nothing of ranks or the anchor sampler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "model/dflash_model.h"
#include "model/dspark_draft.h"
#include "model/dspark_objective.h"

namespace fsdp::model {

struct DSparkStepInputs {
  at::Tensor embedded;  // [B, N*bs, H]: the block tokens through the target's embedding
  at::Tensor context;   // [B, S, n*H]: the target layers' features
  const BlockLayout* layout = nullptr;  // the blocks drawn (anchors, keep)
  at::Tensor input_ids;                 // int64 [B, S]
  at::Tensor loss_mask;                 // [B, S]
  at::Tensor target_hidden;           // [B, S, H] last hidden state, lm_head's dtype; or undefined
  at::Tensor lm_head;                 // [V, H] the target's frozen LM head
  std::optional<double> decay_gamma;  // loss_decay_gamma (absent or <= 0: no decay)
  DSparkAlphas alphas;
  int64_t chunk_blocks = 0;  // objective_chunk_blocks (0: every block at once)
  // Evaluation: the blocks' accepted counts are appended here (dspark_objective's
  // accepted_blocks), for the engine's walk (model/block_acceptance.h).
  std::vector<at::Tensor>* accepted_blocks = nullptr;
};

struct DSparkStep {
  DSparkTerms terms;
  at::Tensor loss_sum;        // ce * ce_num + l1 * l1_num + confidence * confidence_num
  at::Tensor loss_weights;    // [B, N, bs]: the loss's normaliser is their sum over the step
  DSparkBlockLabels labels;   // what each block position was scored against
  at::Tensor prev_token_ids;  // int64 [B, N, bs]: what the Markov head read
};

// The step. When the draft has unit hooks (a sharding engine), the objective is bracketed as one
// use of the head units (markov_head, confidence_head): the objective reads their gathered
// parameters while it runs (and again in backward only for seeds in another proportion than the
// loss's, model/dspark_objective.h).
DSparkStep dspark_step(DSparkDraftImpl& draft, const DSparkStepInputs& in);

}  // namespace fsdp::model
