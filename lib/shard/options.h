// Configuration of the sharding engine: strategy, mixed precision, devices, offload, and the
// communicators it shards and replicates over. The engine takes communicators and never creates
// them; make_comm_groups() builds the usual ones from the comm runtime.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/muon.h"

namespace fsdp::comm {
class Communicator;
}

namespace fsdp::shard {

enum class Strategy {
  kFullShard,    // ZeRO-3: parameters gathered per use, freed after forward and after backward
  kShardGradOp,  // ZeRO-2: parameters stay gathered from forward to the end of backward
  kNoShard,      // DDP: full parameters on every rank, gradients all-reduced
  kHybridShard,  // FULL_SHARD inside a node, gradients all-reduced across nodes
};
// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard" (also FSDP's upper-case names).
Strategy parse_strategy(const std::string& name);
const char* strategy_name(Strategy s);

struct MixedPrecision {
  c10::ScalarType param_dtype = c10::kBFloat16;  // gathered parameters and compute (bf16|fp32)
  c10::ScalarType reduce_dtype = c10::kFloat;    // gradient reduction (fp32|bf16)
  // Master weights, gradient shards and moments are always fp32.
};

struct EngineOptions {
  Strategy strategy = Strategy::kFullShard;
  MixedPrecision mixed_precision;
  c10::Device device =
      c10::Device(c10::kCPU);  // compute device; all non-offloaded state lives here
  // Master shards, gradient shards and moments in host memory (pinned when device is a GPU),
  // optimizer step on the CPU. Results are identical to no offload.
  bool cpu_offload = false;
  // Issue the next unit's all-gather while the current unit computes (forward and backward).
  bool prefetch = true;
  // FULL_SHARD/HYBRID_SHARD: a unit that the previous forward ran again later (the TTT unroll
  // runs every unit T times per micro-batch) stays gathered from its first to its last use in
  // the forward instead of being freed and re-gathered around each use. More gathered memory
  // between uses (at most the whole model), T times fewer forward all-gathers. The first
  // forward (no recorded order yet) frees after every use.
  bool reshard_between_uses = false;
  // Units: names of submodules (paths like "model.layers.0" allowed). Empty: one unit per
  // direct child that has parameters. Every parameter must fall in exactly one unit.
  std::vector<std::string> units;
  optim::AdamWOptions adamw;
  // Host-scalar steps: kAuto = the per-piece loop on the CPU, the fused kernel elsewhere (device
  // step scalars always use the fused kernel).
  optim::AdamWImpl adamw_impl = optim::AdamWImpl::kAuto;
  // Where the optimizer step's scalars live (gradient norm, clip coefficient, non-finite check,
  // step count). kAuto: on the device when the trainable state is device-resident (a GPU
  // without cpu_offload), so the step never synchronises with the host: the fused AdamW kernel
  // reads the clip coefficient, the step count and the skip flag from device memory, and the
  // host reads them only when asked (StepResult::resolve(), step_count()). Otherwise on the
  // host, read every step. kHost / kDevice force one path (kDevice on the CPU: tests). Both
  // paths give the same bits.
  enum class StepScalars { kAuto, kHost, kDevice };
  StepScalars step_scalars = StepScalars::kAuto;
  // --optimizer muon (docs/usage.md "Optimizers"): the parameters optim::muon_group gives Muon
  // are stepped by it (shard/muon_shard.h; their momentum is kept in exp_avg, so checkpoints,
  // resume and resharding carry it), those it gives "AdamW at Muon's learning rate" by AdamW at
  // lr * muon_lr_ratio with Muon's weight decay, the rest by AdamW as configured. Host step
  // scalars (the orthogonalisation is driven from the host).
  bool muon = false;
  optim::MuonOptions muon_options;
  double muon_lr_ratio = 10.0;

  // Throws fsdp::UsageError naming the option for unsupported dtypes or combinations.
  void validate() const;
};

// The communicators a strategy needs. shard: ranks that split each flat buffer (null means a
// group of one: no sharding). replicate: ranks holding identical shards whose gradients are
// all-reduced (null: none). FULL_SHARD/SHARD_GRAD_OP: {world, null}; NO_SHARD: {null, world};
// HYBRID_SHARD: {node, cross-node}.
struct CommGroups {
  std::shared_ptr<comm::Communicator> shard;
  std::shared_ptr<comm::Communicator> replicate;
};
// Builds the groups for `strategy` with comm::make_communicator on `device` (honours
// FSDP_PRETEND_NODES for HYBRID_SHARD through the comm runtime's node split).
CommGroups make_comm_groups(Strategy strategy, const c10::Device& device);

}  // namespace fsdp::shard
