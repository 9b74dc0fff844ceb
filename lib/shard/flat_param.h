// One flat parameter buffer of a unit (its trainable or its frozen parameters): the rank's
// shards (fp32 master, fp32 gradient, AdamW moments; frozen buffers keep one compute-dtype
// shard), the gathered full buffer whose storage is freed and refilled in place, and the
// unsharded gradient buffer that autograd accumulates into. Private to lib/shard: the engine
// decides when to call what; this class never decides policy and never talks to the model.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "shard/options.h"
#include "shard/shard_plan.h"

namespace fsdp::shard {

// A run of consecutive shard elements with one weight-decay setting (padding excluded).
struct DecayRun {
  int64_t offset = 0;
  int64_t length = 0;
  bool decay = true;
};

class FlatParam {
 public:
  // params: the module's parameter tensors in layout order; their values initialise this rank's
  // shard and their storage becomes views of the (initially freed) full buffer.
  FlatParam(FlatLayout layout, std::vector<at::Tensor> params, const EngineOptions& options,
            comm::Communicator* shard_comm, comm::Communicator* replicate_comm);

  const FlatLayout& layout() const { return layout_; }
  bool trainable() const { return layout_.trainable; }
  int shard_rank() const { return shard_rank_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<DecayRun>& decay_runs() const { return runs_; }

  // Shards (shard_numel elements; padding is zero). master is fp32 for trainable buffers and the
  // compute dtype for frozen ones. Host memory when offloading.
  const at::Tensor& master() const { return master_; }
  const at::Tensor& grad_shard() const { return grad_shard_; }
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }

  // --- gathered parameters ---
  // Starts filling the full buffer (all-gather, or a copy for a group of one); no-op when it is
  // already filled or being filled.
  void start_gather();
  // Blocks until the full buffer holds the parameters (starts the gather if needed).
  void wait_gather();
  bool resident() const { return state_ != State::kFree; }
  // Frees the full buffer's bytes; the parameters keep their (now empty) storage. Waits for an
  // in-flight gather first. Groups of one keep their buffer (still valid).
  void release();
  // After the optimizer changed master: refresh the low-precision shard and mark the full
  // buffer stale (freed, or refilled on next use for groups of one).
  void refresh_after_update();

  // --- gradients ---
  // Zeroed unsharded gradient buffer with every parameter's .grad a view of it.
  void prepare_grads();
  bool grads_prepared() const { return grad_full_.defined(); }
  // Makes sure parameter i's gradient lives in the flat buffer (copies it in when autograd
  // created a separate tensor, e.g. when no pre-backward hook ran).
  void adopt_grad(size_t i);
  // The gradients are complete: accumulate locally (sync false) or start the reduction
  // (reduce-scatter over the shard group, averaged). Frees the unsharded buffer(s).
  void reduce_grads(bool sync);
  // Finishes a started reduction: replicate all-reduce (average), then adds into grad_shard.
  void finish_reduce();
  bool reduce_pending() const { return pending_.defined(); }
  void zero_grad();

  // --- accounting ---
  int64_t persistent_device_bytes() const;
  int64_t persistent_host_bytes() const;
  int64_t gathered_bytes() const;     // full buffer bytes now resident
  int64_t grad_buffer_bytes() const;  // unsharded gradient / accumulator bytes now held

 private:
  enum class State { kFree, kInFlight, kReady };
  void allocate_storage();
  void free_storage();

  FlatLayout layout_;
  std::vector<at::Tensor> params_;
  const EngineOptions& options_;
  comm::Communicator* shard_comm_;
  comm::Communicator* replicate_comm_;
  int shard_rank_ = 0;
  c10::Device device_;
  c10::ScalarType compute_dtype_;
  std::vector<DecayRun> runs_;

  at::Tensor master_, grad_shard_, exp_avg_, exp_avg_sq_;
  bool grad_shard_zero_ = true;  // nothing reduced into grad_shard_ since it was zeroed
  at::Tensor compute_shard_;     // all-gather input in the compute dtype on the device (may alias)
  at::Tensor full_;              // parameters are views of this; its storage is freed/refilled
  at::Tensor writer_;            // same storage, own version counter: fills never bump params'
  int64_t full_nbytes_ = 0;
  State state_ = State::kFree;
  comm::WorkPtr gather_work_;

  at::Tensor grad_full_;   // compute dtype, padded; parameters' .grad are views
  at::Tensor acc_full_;    // fp32 local accumulation across micro-batches (no-sync)
  at::Tensor pending_;     // reduction output being produced
  at::Tensor pending_in_;  // its input, kept alive until the work finished
  comm::WorkPtr reduce_work_;
};

}  // namespace fsdp::shard
