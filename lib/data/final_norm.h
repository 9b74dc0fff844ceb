// Features whose hidden_state is the target's last layer BEFORE its final norm (speculators'
// dumps) are read through this wrapper, which applies the target's final RMSNorm in the loader
// threads, so the trainer's target head (docs/reference.md §1: lm_head of the stored state) sees
// what SpecForge's post-norm dumps hold. The norm is computed as the transformers Llama RMSNorm:
// x * rsqrt(mean(x^2) + eps) in fp32, cast to the input dtype (bf16), then times the weight.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "data/dataset.h"

namespace fsdp::data {

// `weight`: the target's final norm weight [H] (any float dtype; used in bf16 as the target
// runs it). Every other method forwards to `inner`; hidden_state_prenorm() is false.
std::shared_ptr<FeatureDataset> with_final_norm(std::shared_ptr<FeatureDataset> inner,
                                                const at::Tensor& weight, double eps);

// The norm itself on hidden [S, H] bf16 (exposed for tests).
at::Tensor apply_final_norm(const at::Tensor& hidden, const at::Tensor& weight, double eps);

}  // namespace fsdp::data
