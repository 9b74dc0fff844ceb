// The ZeRO sharding engine (docs/architecture-shard.md): wraps a torch::nn::Module whose forward
// announces unit boundaries with fsdp::run_unit(), flattens each unit's parameters into flat
// buffers sharded over the shard group, gathers them around each use, reduce-scatters gradients
// into fp32 shards, and runs AdamW on the shards. It owns all parameter storage of the module;
// model code never learns that it is sharded. Never hide collectives behind data-dependent
// branches: every rank must issue the same collectives in the same order.
//
// Use (the trainer in lib/train):
//   auto groups = shard::make_comm_groups(opts.strategy, opts.device);
//   shard::ShardEngine engine(*model, groups, opts);       // model->to(device) first for buffers
//   model->set_unit_hooks(&engine);
//   for each optimizer step:
//     for each micro-batch i of A:
//       engine.set_sync_gradients(i == A - 1);  // only matters with local accumulation
//       loss = model->forward(batch) / A;  loss.backward();
//       // (the engine finishes its gradient reductions at the end of backward by itself)
//     auto r = engine.step(lr, max_grad_norm);    // r.skipped when the gradients are not finite
//   engine.full_state(true) -> full fp32 tensors on rank 0 for export
//   shard::save_state(engine, dir) / shard::load_state(engine, dir)  (any saved world size)
#pragma once

#include <ATen/core/Dict.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/unit_hooks.h"
#include "shard/options.h"
#include "shard/shard_plan.h"

namespace fsdp::shard {

class FlatParam;

// Result of one optimizer step.
// With device-resident step scalars (EngineOptions::step_scalars) the host fields are filled
// only by resolve(), which reads the 0-dim device tensors (one synchronisation); until then
// `resolved` is false.
struct StepResult {
  double grad_norm = 0.0;  // global L2 norm before clipping (NaN/Inf when not finite)
  double clip_coef = 1.0;  // factor applied to the gradients (1 when not clipped)
  bool skipped = false;    // true: non-finite gradients, weights and moments unchanged
  int64_t step = 0;        // optimizer steps applied so far (skipped steps not counted)
  bool resolved = true;
  // The same values on the device (defined only when the step ran with device scalars):
  // grad_norm fp64, clip_coef fp64, skipped fp32 (0 or 1), step fp32.
  at::Tensor grad_norm_t, clip_coef_t, skipped_t, step_t;
  void resolve();
};

// Bytes held per rank. Persistent: state that lives for the whole run (master, gradient and
// moment shards, low-precision shard copies, always-gathered buffers of NO_SHARD). Peaks are
// the largest simultaneous bytes of gathered parameters and of unsharded gradient buffers.
struct MemoryStats {
  int64_t persistent_device_bytes = 0;
  int64_t persistent_host_bytes = 0;  // offloaded state
  int64_t gathered_param_bytes = 0;   // now
  int64_t peak_gathered_param_bytes = 0;
  int64_t grad_buffer_bytes = 0;  // now
  int64_t peak_grad_buffer_bytes = 0;
  int64_t persistent_bytes() const { return persistent_device_bytes + persistent_host_bytes; }
};

class ShardEngine final : public UnitHooks {
 public:
  // Takes over the parameters of `model` (their storage becomes views of the engine's buffers;
  // their current values become the initial master weights). Collective: every rank of the
  // groups constructs the engine with the same model structure and options.
  ShardEngine(torch::nn::Module& model, CommGroups groups, EngineOptions options);
  ~ShardEngine() override;
  ShardEngine(const ShardEngine&) = delete;
  ShardEngine& operator=(const ShardEngine&) = delete;

  // UnitHooks: called by fsdp::run_unit in the model's forward.
  void pre_forward(const std::string& unit) override;
  void post_forward(const std::string& unit, const at::Tensor& output) override;

  // False: accumulate this micro-batch's gradients locally (unsharded, fp32) without
  // communication; the next backward with true reduces everything at once. Default true.
  void set_sync_gradients(bool sync) { sync_gradients_ = sync; }
  bool sync_gradients() const { return sync_gradients_; }

  // Completes the gradient reductions of the last backward. Runs automatically at the end of
  // every backward that reached a unit; calling it again is a no-op.
  void finish_backward();

  // Multiplies the step's reduced gradient shards by `factor` (finishing the last backward
  // first): a loss summed over the step rather than averaged is divided here by its global
  // normaliser, once every micro-batch has run. Call before step(); local, no communication.
  void scale_gradients(double factor);

  // Global grad norm, clipping (max_grad_norm <= 0: off), non-finite check, AdamW on every
  // trainable shard with learning rate lr, then clears the gradient shards. Collective.
  StepResult step(double lr, double max_grad_norm);
  // Clears gradient shards and local accumulators (step() does this itself).
  void zero_grad();
  // Optimizer steps applied so far (reads the device counter with device step scalars).
  int64_t step_count() const;
  void set_step_count(int64_t s);
  // Steps taken before the optimizer's state was started fresh on a resume (load_state's
  // fresh_optimizer); AdamW's bias correction counts the steps since. 0 for every other run.
  int64_t optimizer_since() const { return optimizer_since_; }
  void set_optimizer_since(int64_t s) { optimizer_since_ = s; }

  MemoryStats memory() const;
  const std::vector<const FlatLayout*>& layouts() const { return layouts_; }
  const std::vector<std::string>& unit_names() const { return unit_names_; }
  const EngineOptions& options() const { return options_; }
  const CommGroups& groups() const { return groups_; }
  int shard_rank() const;
  int shard_size() const;
  int replicate_rank() const;
  int replicate_size() const;

  // Full fp32 tensors by parameter name (frozen ones converted to fp32; left out with
  // include_frozen false, which gathers and copies nothing of them: an export without the frozen
  // embedding). Collective over the shard group; with rank0_only, ranks other than world rank 0
  // get an empty map.
  // skip_frozen_units: units whose frozen parameters are left out even with include_frozen
  // (a LoRA export needs the frozen base weights but not the frozen embedding).
  std::map<std::string, at::Tensor> full_state(bool rank0_only, bool include_frozen = true,
                                               const std::set<std::string>& skip_frozen_units = {});
  // Copies full tensors into this rank's shards (any dtype/device; fp32 masters). Every
  // parameter must be present with its shape unless allow_missing (then it keeps its value).
  void load_full_state(const std::map<std::string, at::Tensor>& tensors,
                       bool allow_missing = false);

  // Internal access for the state files and tests.
  std::vector<FlatParam*> flat_params() const;

 private:
  struct Unit;
  void check_groups() const;
  std::vector<std::string> unit_list() const;
  void add_unit(const std::string& name, torch::nn::Module& module,
                std::unordered_map<const void*, std::string>& owner);
  void install_grad_hooks(Unit& u);
  Unit& unit(const std::string& name);
  void gather(Unit& u, bool blocking);
  void release(Unit& u);
  void pre_backward(Unit& u);
  void on_grad_ready(Unit& u);
  void reduce_unit(Unit& u);
  void prefetch_after(size_t position);
  bool runs_again(const Unit& u) const;
  void prefetch_before(Unit& u);
  void track_memory();
  bool device_step_scalars(const at::Tensor& grad) const;
  // --optimizer muon's step (EngineOptions::muon): AdamW on the pieces optim::muon_group gives
  // it (at lr, or lr * muon_lr_ratio), Muon on the matrices (shard/muon_shard.h), unit by unit.
  void muon_step(double lr, double clip);
  StepResult step_on_device(const std::vector<at::Tensor>& valid_grads, double lr,
                            double max_grad_norm);

  torch::nn::Module& model_;
  CommGroups groups_;
  EngineOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::map<std::string, Unit*> by_name_;
  std::vector<std::string> unit_names_;
  std::vector<const FlatLayout*> layouts_;
  std::vector<Unit*> forward_order_;  // unit of each use, recorded during the last forward
  std::vector<Unit*> current_order_;  // being recorded
  std::vector<bool> used_later_;      // forward_order_[i] runs again after position i
  bool order_matches_ = true;         // current_order_ is a prefix of forward_order_
  bool in_backward_ = false;
  bool sync_gradients_ = true;
  int64_t step_count_ = 0;
  int64_t optimizer_since_ = 0;
  at::Tensor step_dev_;  // fp32 0-dim step count on the device (device step scalars only)
  int64_t peak_gathered_ = 0;
  int64_t peak_grad_ = 0;
};

// Per-rank training state in `dir`: shard_<r>.pt per shard rank (masters, moments, frozen
// shards) written by replicate rank 0, and manifest.txt (format version, strategy, group
// sizes, step, flat layouts). Collective; the directory is created if missing. A write error
// (full disk) is thrown on the ranks that met it, after the collective part, so no rank is left
// waiting; the caller agrees on the outcome. lib/checkpoint handles temporary directories,
// renames and completion markers around these calls.
void save_state(ShardEngine& engine, const std::string& dir);
// What save_state writes to this rank's shard file: <unit key>/master, and for trainable flat
// buffers /exp_avg and /exp_avg_sq, as host tensors.
c10::Dict<std::string, at::Tensor> shard_state_dict(ShardEngine& engine);
// The saved master weights, full size, by parameter name (fp32 for trainable parameters),
// reassembled on the host from every shard file of a state directory without an engine or MPI
// (DeepSpeed's zero_to_fp32.py, for fsdp-train checkpoints). Throws naming a damaged file.
// include_frozen=false leaves out the frozen buffers (the embedding an export does not carry).
// The tensors are views of one buffer per flat (no copy per parameter).
std::map<std::string, at::Tensor> consolidate_state(const std::string& dir,
                                                    bool include_frozen = true);
// Loads a state saved by save_state at any shard group size (resharding when it differs).
// The flat layouts (parameter names, shapes, order per unit) must match; throws fsdp::Error
// naming the file and the mismatch otherwise. fresh_optimizer: the weights and the step only,
// the optimizer's state zero (--reset-optimizer-state; the saved optimizer may then differ).
void load_state(ShardEngine& engine, const std::string& dir, bool fresh_optimizer = false);

}  // namespace fsdp::shard
