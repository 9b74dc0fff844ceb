// Global gradient norm over sharded gradients and the clip coefficient (torch clip_grad_norm_
// semantics). Callers pass only the elements they own (padding excluded) and the communicator
// over which shards are disjoint; replicas of the same shard must not be summed twice.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace fsdp::comm {
class Communicator;
}

namespace fsdp::optim {

// Sum of squares of a floating tensor, accumulated in double.
double sum_of_squares(const at::Tensor& t);

// sqrt of the sum over `comm`'s ranks of local_sum_sq (all-reduce of one fp64 value). A null
// comm (or one of size 1) means this rank holds every element. NaN/Inf propagate. `device` is
// where the communicator's tensors live (CUDA for NCCL).
double global_norm(double local_sum_sq, comm::Communicator* comm,
                   c10::Device device = c10::Device(c10::kCPU));

// min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_; 1 when max_norm <= 0
// (clipping off). The caller multiplies gradients by it.
double clip_coefficient(double norm, double max_norm);

}  // namespace fsdp::optim
