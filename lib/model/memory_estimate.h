// The memory one rank needs to train a draft (docs/troubleshooting.md "Memory estimate"): model
// state, frozen weights and one micro-batch's activations, in closed form from the config and the
// run's sizes, so a run that cannot fit its device stops at start-up (exit 2) with the numbers
// instead of being killed by the OOM killer minutes later. Torch-free; never allocates tensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/draft_config.h"

namespace fsdp::model {

// The chunked draft head (docs/model.md "Chunked head and loss"): logits of at most this many
// elements (128 MiB in fp32) per chunk when the chunk size is automatic.
inline constexpr int64_t kHeadChunkElements = int64_t{1} << 25;

// Rows per chunk of one TTT step's draft norm, lm_head and loss, or 0 for one piece (the
// unchunked path that keeps the step's logits for backward). `requested` is --head-chunk-rows:
// -1 off, n >= 1 rows per chunk, 0 automatic: chunks of kHeadChunkElements / vocab rows (1,048
// at Vd = 32,000) once a step has more than four chunks' worth of rows (4,192 loss rows at Vd =
// 32,000), so short samples keep the faster unchunked path.
inline int64_t head_chunk_rows(int64_t requested, int64_t rows, int64_t vocab) {
  if (requested != 0) return std::max<int64_t>(requested, 0);
  const int64_t chunk = std::max<int64_t>(1, kHeadChunkElements / std::max<int64_t>(vocab, 1));
  return rows > 4 * chunk ? chunk : 0;
}

// What the run decides besides the draft's sizes.
struct MemoryPlan {
  int64_t max_length = 2048;  // S: tokens per sample (--max-length)
  int64_t micro_batch = 1;    // B: samples per micro-batch (--draft-micro-batch-size)
  int64_t ttt_length = 7;     // T: unroll steps (--ttt-length)
  bool activation_checkpointing = false;
  int64_t head_chunk_rows = 0;  // --head-chunk-rows (head_chunk_rows' `requested`)
  int64_t compute_bytes = 2;    // bytes per element of the compute dtype (bf16 2, fp32 4)
  // Ranks the trainable state (fp32 master, Adam moments, fp32 gradient) is sharded over: the
  // world for full_shard and shard_grad_op, the node for hybrid_shard, 1 for no_shard.
  int64_t shard_ranks = 1;
  // The compute copy stays whole from forward to backward (no_shard, shard_grad_op); otherwise
  // one unit at a time is gathered.
  bool whole_compute_copy = false;
  // The sharded state lives on the host (--cpu-offload), not on the device.
  bool state_on_host = false;
  // Ranks sharing this memory: the node's ranks for CPU training (one host), 1 for a GPU.
  int64_t ranks_sharing_memory = 1;
  // Sequence parallelism (--sp-ulysses-size): each rank of a group holds ceil(S / P) positions
  // of the sample (plus T - 1 of the next slice's features), and the attention's keys and
  // values of all S positions for nkv / P heads: the per-token terms count a slice.
  int64_t seq_parallel = 1;
  // The positions one rank holds of a sample: S, or its slice.
  int64_t local_tokens() const {
    const int64_t P = std::max<int64_t>(seq_parallel, 1);
    return (max_length + P - 1) / P;
  }
};

// Bytes for one rank (long double: no overflow whatever the sizes).
struct MemoryEstimate {
  long double state = 0;        // sharded fp32 master, Adam moments, fp32 gradient (16 B/param)
  long double compute = 0;      // compute-dtype parameters and their gradients while gathered
  long double frozen = 0;       // embedding [V, H], the target's LM head [V, Ht] and [Vd, Ht]
  long double activations = 0;  // one micro-batch: saved for backward + the largest transient
  long double total() const { return state + compute + frozen + activations; }
};

// fc, midlayer, norm and lm_head parameters (count_parameters' trainable) in long double: no
// overflow whatever the sizes.
long double trainable_parameter_count(const DraftConfig& cfg);

// Activation bytes per token of one TTT step that autograd keeps for backward (lm_head, loss
// and norm on every row, the worst case where every position is a loss row; with a chunked head
// only the head's input rows).
long double step_activation_bytes_per_token(const DraftConfig& cfg, const MemoryPlan& plan);

MemoryEstimate estimate_training_memory(const DraftConfig& cfg, const MemoryPlan& plan);

// Throws UsageError (exit 2) when ranks_sharing_memory x the estimate exceeds `memory_bytes`
// (the device's total memory; 0 = unknown: no check), naming the sizes, both figures and what to
// change. The estimate is a lower bound of the measured peak, so a refusal is never a run that
// would have fit.
void check_training_memory(const DraftConfig& cfg, const MemoryPlan& plan, uint64_t memory_bytes,
                           const std::string& device);

// "3.5 GiB": how the messages give sizes.
std::string format_gib(long double bytes);

// Physical memory of this host (0 if unknown): the memory of a CPU run.
uint64_t host_memory_bytes();

}  // namespace fsdp::model
