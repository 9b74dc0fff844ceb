// Global gradient norm over sharded gradients and the clip coefficient (torch clip_grad_norm_
// semantics). Callers pass only the elements they own (padding excluded) and the communicator
// over which shards are disjoint; replicas of the same shard must not be summed twice.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

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

// The same global norm for pieces on an accelerator: the local sum of squares stays on the
// device (each piece's norm reduced in its own dtype there, the pieces' squares summed in
// fp64; on the CPU each piece reduced in fp64), is all-reduced there, and the host reads one
// value: one synchronisation per step instead of one per piece. Works on any device.
double global_norm_on_device(const std::vector<at::Tensor>& pieces, comm::Communicator* comm);
// The same norm left on the pieces' device as a 0-dim fp64 tensor (no host read at all; the
// same bits as global_norm_on_device).
at::Tensor global_norm_tensor(const std::vector<at::Tensor>& pieces, comm::Communicator* comm);

// min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_; 1 when max_norm <= 0
// (clipping off). The caller multiplies gradients by it.
double clip_coefficient(double norm, double max_norm);
// The same coefficient computed on norm's device (fp64, same bits as the host formula); NaN
// when norm is not finite.
at::Tensor clip_coefficient_tensor(const at::Tensor& norm, double max_norm);

}  // namespace fsdp::optim
