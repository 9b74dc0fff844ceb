// y = x W^T whose weight gradient is summed over the TTT steps inside the weight-gradient GEMM
// (docs/model.md "Fused CUDA kernels": the weight-gradient sum): each use's backward adds
// dY^T X straight into the parameter's .grad (beta = 1, the sharding engine's flat gradient)
// instead of returning it for autograd to sum in separate passes, except the use that completes
// the count, whose gradient goes through autograd as usual so the gradient-ready hooks fire.
// Model code only: knows nothing about the engine beyond "the parameter's .grad, if any".
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

namespace fsdp::model {

// The uses of one weight in one forward graph (one TTT unroll): forward counts them, backward
// counts them done. A fresh one per unroll (Eagle3DraftImpl::begin_unroll): a graph dropped
// without backward leaves nothing behind.
struct LinearUses : torch::CustomClassHolder {
  explicit LinearUses(at::Tensor w) : weight(std::move(w)) {}
  at::Tensor weight;  // the parameter itself (its .grad is read in backward)
  int64_t uses = 0, done = 0;
};

// at::linear(x, uses->weight) with the in-place weight-gradient sum; values and gradients equal
// to at::linear's within rounding (the GEMM's own accumulation replaces separate additions).
at::Tensor linear_grad_in_place(const at::Tensor& x, const c10::intrusive_ptr<LinearUses>& uses);

// How many weight-gradient GEMMs have accumulated into a .grad in place in this process (tests).
int64_t linear_grad_in_place_adds();

}  // namespace fsdp::model
