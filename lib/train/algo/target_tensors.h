// The frozen tensors every draft family reads out of the target checkpoint: its token
// embedding and its LM head, checked against the draft's sizes (shape, not fp8, finite).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "config/train_config.h"

namespace fsdp::algo {

struct TargetShape {
  int64_t vocab_size = 0;         // V: rows of both tensors
  int64_t hidden_size = 0;        // Ht: the target's hidden size (columns of both)
  int64_t draft_hidden_size = 0;  // H: the draft's; must equal Ht (the draft embeds with it)
};

struct TargetTensors {
  at::Tensor embedding;  // [V, Ht]
  at::Tensor lm_head;    // [V, Ht]
};

// Reads --embedding-key and --lm-head-key (or what the target's own config names) from
// --target-model-path. UsageError naming the tensor, the file and the flag for a wrong shape,
// fp8 weights, non-finite values or a draft of another hidden size.
TargetTensors read_target_tensors(const config::TrainConfig& cfg, const TargetShape& shape);

}  // namespace fsdp::algo
