// AdamW over flat fp32 shards: one fused pass per contiguous piece of a shard, with the exact
// arithmetic of torch.optim.AdamW (decoupled weight decay, bias correction, eps outside the
// square root). Knows nothing about sharding or communication; never allocates per step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Parameters with fewer dimensions than this get no weight decay (norm weights, biases):
  // 2 excludes every 1-D parameter, 0 decays everything.
  int decay_min_dim = 2;

  // Throws fsdp::UsageError naming the option (--adam-beta1, ...) when out of range.
  void validate() const;
};

// Scalars shared by every piece in one optimizer step.
struct AdamWStep {
  double lr = 0.0;
  int64_t step = 1;         // 1-based count of applied steps (bias correction uses it)
  double grad_scale = 1.0;  // clip coefficient, multiplied into the gradient before use
};

// Updates param, exp_avg and exp_avg_sq in place from grad (all fp32, same numel, contiguous,
// same device) as torch.optim.AdamW does for one step:
//   g = grad * grad_scale; p *= 1 - lr*wd; m = lerp(m, g, 1-beta1); v = beta2*v + (1-beta2)*g*g
//   p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
// `weight_decay` is the decay for this piece (0 for excluded parameters). CPU tensors take one
// vectorisable loop split over threads; other devices use the equivalent tensor operations.
void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const AdamWOptions& options, double weight_decay,
                  const AdamWStep& step);

// How many threads adamw_update's CPU loop (and the host sum of squares) actually run on now:
// at most --threads, and 1 if this build's at::parallel_for cannot run in parallel (sources
// compiled without OpenMP: LibTorch's parallel_for is an inline OpenMP template). Logged at
// start-up for --cpu-offload, checked by a unit test.
int host_loop_threads();

// One contiguous piece of a flat shard and the weight decay it gets.
struct AdamWPiece {
  at::Tensor param, grad, exp_avg, exp_avg_sq;  // fp32, same numel, contiguous, same device
  double weight_decay = 0.0;
};

enum class AdamWImpl {
  kAuto,   // CPU pieces: adamw_update's loop; other devices: the fused kernel
  kLoop,   // adamw_update per piece
  kFused,  // torch's fused multi-tensor AdamW kernel (at::_fused_adamw_, the kernel behind
           // torch.optim.AdamW(fused=True)): one launch per weight-decay value for all pieces
           // instead of ~8 elementwise kernels per piece. Same formula; `grad` is overwritten
           // with the scaled gradient.
};

// Updates every piece for one step (see adamw_update for the arithmetic).
void adamw_update_all(const std::vector<AdamWPiece>& pieces, const AdamWOptions& options,
                      const AdamWStep& step, AdamWImpl impl = AdamWImpl::kAuto);

// One step whose scalars stay on the device (no host synchronisation), for the fused kernel:
// `step` fp32 0-dim holds the 1-based step count the update uses; `clip` fp64 0-dim multiplies
// the gradients (the clip coefficient); `found_inf` fp32 0-dim: when 1 the kernel leaves every
// parameter, moment and gradient untouched (a skipped step). All on the pieces' device.
struct AdamWDeviceStep {
  double lr = 0.0;
  at::Tensor step, clip, found_inf;
};

// The fused kernel (AdamWImpl::kFused) for every piece with device-resident scalars: the same
// arithmetic and bits as adamw_update_all with the host values of the same scalars.
void adamw_update_all_device(const std::vector<AdamWPiece>& pieces, const AdamWOptions& options,
                             const AdamWDeviceStep& step);

// True when a parameter of this shape gets weight decay under `options`.
bool decays(const AdamWOptions& options, int64_t dim);

}  // namespace fsdp::optim
