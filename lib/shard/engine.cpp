// The sharding engine's unit lifecycle (see engine.h): gather before a use, release after it,
// re-gather on the output gradient, reduce when the unit's gradients are complete, finish at
// the end of backward, and the optimizer step over the shards. Never branches on data.
#include "shard/engine.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <functional>
#include <set>
#include <unordered_map>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "optim/adamw.h"
#include "optim/grad_norm.h"
#include "shard/flat_param.h"
#include "shard/muon_shard.h"

namespace fsdp::shard {

struct ShardEngine::Unit {
  std::string name;
  size_t index = 0;
  std::unique_ptr<FlatParam> trainable;  // null when the unit has no trainable parameters
  std::unique_ptr<FlatParam> frozen;     // null when it has no frozen ones
  bool needs_backward = false;           // an output required grad in the last forward
  bool backward_started = false;
  bool backward_done = false;
  size_t grads_fired = 0;

  std::vector<FlatParam*> flats() const {
    std::vector<FlatParam*> v;
    if (trainable) v.push_back(trainable.get());
    if (frozen) v.push_back(frozen.get());
    return v;
  }
};

namespace {

// Post-accumulate-grad hook: fires once per backward per leaf, after autograd summed all uses'
// gradients into .grad. That is the signal that one parameter's gradient is complete.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn_(); }

 private:
  std::function<void()> fn_;
};

// The optimizer's pieces of one flat parameter: its runs of equal weight-decay setting.
void append_adamw_pieces(FlatParam& f, double weight_decay,
                         std::vector<optim::AdamWPiece>& pieces) {
  for (const DecayRun& run : f.decay_runs()) {
    pieces.push_back({f.master().narrow(0, run.offset, run.length),
                      f.grad_shard().narrow(0, run.offset, run.length),
                      f.exp_avg().narrow(0, run.offset, run.length),
                      f.exp_avg_sq().narrow(0, run.offset, run.length),
                      run.decay ? weight_decay : 0.0});
  }
}

bool frees_after_forward(Strategy s) {
  return s == Strategy::kFullShard || s == Strategy::kHybridShard;
}

}  // namespace

ShardEngine::ShardEngine(torch::nn::Module& model, CommGroups groups, EngineOptions options)
    : model_(model), groups_(std::move(groups)), options_(std::move(options)) {
  options_.validate();
  check_groups();
  std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model_.named_modules("", /*include_self=*/false)) {
    modules[item.key()] = item.value();
  }
  std::unordered_map<const void*, std::string> owner;
  for (const auto& name : unit_list()) {
    auto it = modules.find(name);
    if (it == modules.end()) {
      std::string avail;
      for (const auto& c : model_.named_children()) avail += (avail.empty() ? "" : ", ") + c.key();
      FSDP_USAGE_FAIL(str("unit '", name, "' is not a submodule of the model"),
                      str("use submodule names (paths with dots allowed); children are: ", avail));
    }
    add_unit(name, *it->second, owner);
  }
  for (const auto& p : model_.named_parameters(/*recurse=*/true)) {
    FSDP_USAGE_CHECK(owner.count(p.value().unsafeGetTensorImpl()),
                     str("parameter ", p.key(), " is in no unit"),
                     "add its submodule to the unit list, or move it into a submodule");
  }
  for (auto& u : units_) {
    for (FlatParam* f : u->flats()) layouts_.push_back(&f->layout());
    install_grad_hooks(*u);
  }
}

// The groups must fit the strategy; device step scalars keep the gradient norm where the
// gradient shards are, and offloaded shards are on the host, which a GPU communicator cannot
// reduce.
void ShardEngine::check_groups() const {
  const bool sharded = options_.strategy != Strategy::kNoShard;
  FSDP_USAGE_CHECK(sharded || !groups_.shard || groups_.shard->size() == 1,
                   "NO_SHARD was given a shard group of more than one rank",
                   "pass CommGroups{nullptr, world} (make_comm_groups does this)");
  FSDP_USAGE_CHECK(options_.strategy == Strategy::kHybridShard ||
                       options_.strategy == Strategy::kNoShard || !groups_.replicate ||
                       groups_.replicate->size() == 1,
                   str(strategy_name(options_.strategy), " was given a replicate group"),
                   "use HYBRID_SHARD to replicate across nodes");
  FSDP_USAGE_CHECK(options_.step_scalars != EngineOptions::StepScalars::kDevice ||
                       !options_.cpu_offload || !groups_.shard || groups_.shard->size() == 1 ||
                       groups_.shard->device_type() == c10::kCPU,
                   "--step-scalars device with --cpu-offload: the offloaded gradient shards are "
                   "in host memory and the gpu communicator cannot reduce their norm",
                   "use --step-scalars auto (or host) with --cpu-offload");
}

// The named submodules of the options, or one unit per direct child with parameters.
std::vector<std::string> ShardEngine::unit_list() const {
  std::vector<std::string> names = options_.units;
  if (names.empty()) {
    for (const auto& child : model_.named_children()) {
      if (!child.value()->parameters(/*recurse=*/true).empty()) names.push_back(child.key());
    }
  }
  FSDP_USAGE_CHECK(!names.empty(), "the model has no submodule with parameters to shard",
                   "wrap the model's layers in submodules and name them as units");
  return names;
}

// One unit over `module`'s parameters: a flat buffer of the trainable ones and one of the frozen
// ones. `owner` records which unit holds each parameter, so that units cannot overlap.
void ShardEngine::add_unit(const std::string& name, torch::nn::Module& module,
                           std::unordered_map<const void*, std::string>& owner) {
  auto u = std::make_unique<Unit>();
  u->name = name;
  u->index = units_.size();
  std::vector<ParamSpec> tspec, fspec;
  std::vector<at::Tensor> tparams, fparams;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    const std::string full = name + "." + p.key();
    const void* impl = p.value().unsafeGetTensorImpl();
    FSDP_USAGE_CHECK(
        !owner.count(impl),
        str("parameter ", full, " belongs to units '", owner[impl], "' and '", name, "'"),
        "units must not overlap: name sibling submodules, not a parent and child");
    owner[impl] = name;
    ParamSpec spec{full, p.value().sizes().vec(), optim::decays(options_.adamw, p.value().dim())};
    if (p.value().requires_grad()) {
      tspec.push_back(spec);
      tparams.push_back(p.value());
    } else {
      fspec.push_back(spec);
      fparams.push_back(p.value());
    }
  }
  FSDP_USAGE_CHECK(!tspec.empty() || !fspec.empty(), str("unit '", name, "' has no parameters"),
                   "remove it from the unit list");
  const int group = groups_.shard ? groups_.shard->size() : 1;
  comm::Communicator* sc = groups_.shard.get();
  comm::Communicator* rc = groups_.replicate.get();
  if (!tspec.empty()) {
    u->trainable = std::make_unique<FlatParam>(make_flat_layout(name, true, tspec, group), tparams,
                                               options_, sc, rc);
  }
  if (!fspec.empty()) {
    u->frozen = std::make_unique<FlatParam>(make_flat_layout(name, false, fspec, group), fparams,
                                            options_, sc, rc);
  }
  by_name_[name] = u.get();
  unit_names_.push_back(name);
  units_.push_back(std::move(u));
}

// Each trainable parameter's accumulated gradient moves into the unit's flat gradient; the last
// one of the unit's backward starts its reduction.
void ShardEngine::install_grad_hooks(Unit& u) {
  if (!u.trainable) return;
  Unit* up = &u;
  const auto& params = u.trainable->params();
  for (size_t i = 0; i < params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        params[i], std::make_unique<GradReadyHook>([this, up, i] {
          up->trainable->adopt_grad(i);
          if (++up->grads_fired == up->trainable->params().size()) on_grad_ready(*up);
        }));
  }
}

ShardEngine::~ShardEngine() {
  for (auto& u : units_) {
    if (!u->trainable) continue;
    for (const auto& p : u->trainable->params()) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    }
  }
}

ShardEngine::Unit& ShardEngine::unit(const std::string& name) {
  auto it = by_name_.find(name);
  FSDP_CHECK(it != by_name_.end(),
             str("the model ran unit '", name, "' that the engine does not know"),
             "pass the model's run_unit names as EngineOptions::units");
  return *it->second;
}

int ShardEngine::shard_rank() const {
  return groups_.shard ? groups_.shard->rank() : 0;
}
int ShardEngine::shard_size() const {
  return groups_.shard ? groups_.shard->size() : 1;
}
int ShardEngine::replicate_rank() const {
  return groups_.replicate ? groups_.replicate->rank() : 0;
}
int ShardEngine::replicate_size() const {
  return groups_.replicate ? groups_.replicate->size() : 1;
}

std::vector<FlatParam*> ShardEngine::flat_params() const {
  std::vector<FlatParam*> v;
  for (const auto& u : units_)
    for (FlatParam* f : u->flats()) v.push_back(f);
  return v;
}

void ShardEngine::track_memory() {
  int64_t g = 0, b = 0;
  for (FlatParam* f : flat_params()) {
    g += f->gathered_bytes();
    b += f->grad_buffer_bytes();
  }
  peak_gathered_ = std::max(peak_gathered_, g);
  peak_grad_ = std::max(peak_grad_, b);
}

void ShardEngine::gather(Unit& u, bool blocking) {
  for (FlatParam* f : u.flats()) f->start_gather();
  if (blocking)
    for (FlatParam* f : u.flats()) f->wait_gather();
  track_memory();
}

void ShardEngine::release(Unit& u) {
  for (FlatParam* f : u.flats()) f->release();
}

void ShardEngine::pre_forward(const std::string& name) {
  Unit& u = unit(name);
  const bool training = at::GradMode::is_enabled();
  if (training) {
    const size_t pos = current_order_.size();
    if (pos == 0) order_matches_ = true;
    order_matches_ = order_matches_ && pos < forward_order_.size() && forward_order_[pos] == &u;
    current_order_.push_back(&u);
  }
  gather(u, /*blocking=*/true);
  if (training && options_.prefetch) prefetch_after(current_order_.size() - 1);
}

void ShardEngine::prefetch_after(size_t pos) {
  // Follow the order of the previous forward while this one matches it.
  if (pos + 1 >= forward_order_.size() || forward_order_[pos] != current_order_[pos]) return;
  Unit* next = forward_order_[pos + 1];
  if (next != current_order_[pos]) gather(*next, /*blocking=*/false);
}

void ShardEngine::post_forward(const std::string& name, const at::Tensor& output) {
  Unit& u = unit(name);
  if (at::GradMode::is_enabled() && output.defined() && output.requires_grad()) {
    u.needs_backward = true;
    Unit* up = &u;
    output.register_hook([this, up](const at::Tensor&) { pre_backward(*up); });
  }
  if (frees_after_forward(options_.strategy) && !runs_again(u)) release(u);
}

bool ShardEngine::runs_again(const Unit& u) const {
  // Only with a recorded order that this forward has followed so far: every rank then makes
  // the same choice, because all ranks record the same order.
  if (options_.reshard_between_uses || !at::GradMode::is_enabled() || !order_matches_) return false;
  // u's latest use: the last one entered, or an enclosing one when uses nest (the draft's
  // chunked head runs lm_head's use inside the norm's).
  for (size_t pos = current_order_.size(); pos-- > 0;) {
    if (current_order_[pos] == &u) return pos < used_later_.size() && used_later_[pos];
  }
  return false;
}

void ShardEngine::pre_backward(Unit& u) {
  if (!in_backward_) {
    in_backward_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  if (u.backward_started) return;
  u.backward_started = true;
  gather(u, /*blocking=*/true);
  if (u.trainable) u.trainable->prepare_grads();
  track_memory();
  if (options_.prefetch) prefetch_before(u);
}

void ShardEngine::prefetch_before(Unit& u) {
  // The unit that ran before u's last use in the previous forward is the next one backward.
  size_t pos = forward_order_.size();
  for (size_t i = forward_order_.size(); i-- > 0;) {
    if (forward_order_[i] == &u) {
      pos = i;
      break;
    }
  }
  for (size_t i = pos; i-- > 0 && pos < forward_order_.size();) {
    Unit* v = forward_order_[i];
    if (v == &u) continue;
    if (v->needs_backward && !v->backward_started && !v->backward_done) gather(*v, false);
    return;
  }
}

void ShardEngine::on_grad_ready(Unit& u) {
  u.backward_done = true;
  reduce_unit(u);
  if (frees_after_forward(options_.strategy)) {
    u.trainable->release();
    // Frozen parameters of the unit may still feed input gradients: freed at the end.
  }
}

void ShardEngine::reduce_unit(Unit& u) {
  u.trainable->reduce_grads(sync_gradients_);
  track_memory();
}

void ShardEngine::finish_backward() {
  // Forward order of this iteration becomes the prefetch plan of the next.
  if (!current_order_.empty()) {
    forward_order_ = current_order_;
    current_order_.clear();
    used_later_.assign(forward_order_.size(), false);
    std::set<const Unit*> seen;
    for (size_t i = forward_order_.size(); i-- > 0;) {
      used_later_[i] = seen.count(forward_order_[i]) > 0;
      seen.insert(forward_order_[i]);
    }
  }
  if (!in_backward_) return;
  // Units whose parameters were not all reached still reduce (zeros), in unit order on all ranks.
  for (auto& u : units_) {
    if (u->trainable && u->backward_started && !u->backward_done) {
      u->backward_done = true;
      reduce_unit(*u);
    }
  }
  for (auto& u : units_)
    if (u->trainable) u->trainable->finish_reduce();
  if (options_.strategy != Strategy::kNoShard) {
    for (auto& u : units_) release(*u);
  }
  for (auto& u : units_) {
    u->backward_started = false;
    u->backward_done = false;
    u->grads_fired = 0;
  }
  in_backward_ = false;
}

void ShardEngine::zero_grad() {
  for (FlatParam* f : flat_params()) f->zero_grad();
}

void StepResult::resolve() {
  if (resolved) return;
  at::Tensor host =
      at::stack({grad_norm_t, clip_coef_t, skipped_t.to(at::kDouble), step_t.to(at::kDouble)})
          .to(at::kCPU);
  const double* v = host.data_ptr<double>();
  grad_norm = v[0];
  clip_coef = v[1];
  skipped = v[2] != 0.0;
  step = static_cast<int64_t>(v[3]);
  resolved = true;
}

int64_t ShardEngine::step_count() const {
  return step_dev_.defined() ? static_cast<int64_t>(step_dev_.item<float>()) : step_count_;
}

void ShardEngine::set_step_count(int64_t s) {
  step_count_ = s;
  if (step_dev_.defined()) step_dev_.fill_(static_cast<double>(s));
}

bool ShardEngine::device_step_scalars(const at::Tensor& grad) const {
  using S = EngineOptions::StepScalars;
  if (options_.step_scalars == S::kHost) return false;
  if (options_.step_scalars == S::kDevice) return true;
  return !grad.device().is_cpu();
}

StepResult ShardEngine::step_on_device(const std::vector<at::Tensor>& valid_grads, double lr,
                                       double max_grad_norm) {
  // Nothing here reads a value on the host: the norm, the skip flag and the clip coefficient
  // stay on the device and the fused kernel reads them there (a non-finite norm makes it leave
  // everything untouched, as the host path's skip does).
  const at::Tensor norm = optim::global_norm_tensor(valid_grads, groups_.shard.get());
  const at::Tensor found_inf = norm.isfinite().logical_not().to(at::kFloat);
  const at::Tensor clip = at::where(found_inf.to(at::kBool), at::ones_like(norm),
                                    optim::clip_coefficient_tensor(norm, max_grad_norm));
  if (!step_dev_.defined()) {
    step_dev_ = at::full({}, static_cast<double>(step_count_), norm.options().dtype(at::kFloat));
  }
  step_dev_.add_(1.0);
  std::vector<optim::AdamWPiece> pieces;
  for (const auto& u : units_) {
    if (!u->trainable) continue;
    FlatParam& f = *u->trainable;
    append_adamw_pieces(f, options_.adamw.weight_decay, pieces);
  }
  const at::Tensor adam_step = optimizer_since_ ? step_dev_ - optimizer_since_ : step_dev_;
  optim::adamw_update_all_device(pieces, options_.adamw, {lr, adam_step, clip, found_inf});
  step_dev_.sub_(found_inf);
  for (const auto& u : units_)
    if (u->trainable) u->trainable->refresh_after_update();
  zero_grad();
  current_order_.clear();
  StepResult r;
  r.resolved = false;
  r.grad_norm_t = norm;
  r.clip_coef_t = clip;
  r.skipped_t = found_inf;
  r.step_t = step_dev_.clone();
  return r;
}

void ShardEngine::scale_gradients(double factor) {
  finish_backward();
  c10::NoGradGuard no_grad;
  for (const auto& u : units_) {
    if (u->trainable && u->trainable->grad_shard().defined())
      u->trainable->grad_shard().mul_(factor);
  }
}

StepResult ShardEngine::step(double lr, double max_grad_norm) {
  finish_backward();
  StepResult r;
  // Replicas hold identical gradient shards after their all-reduce: sum over the shard group only.
  std::vector<at::Tensor> valid_grads;
  for (const auto& u : units_) {
    if (!u->trainable) continue;
    const FlatParam& f = *u->trainable;
    valid_grads.push_back(f.grad_shard().narrow(0, 0, f.layout().valid_numel(f.shard_rank())));
  }
  // (The gradients' device never changes, so an engine takes the same path every step.)
  if (!valid_grads.empty() && !options_.muon && device_step_scalars(valid_grads.front())) {
    return step_on_device(valid_grads, lr, max_grad_norm);
  }
  if (!valid_grads.empty() && !valid_grads.front().device().is_cpu()) {
    // Device-resident gradients (NCCL): one host read per step.
    r.grad_norm = optim::global_norm_on_device(valid_grads, groups_.shard.get());
  } else {
    double local = 0.0;
    for (const at::Tensor& g : valid_grads) local += optim::sum_of_squares(g);
    const c10::Device norm_device = groups_.shard && groups_.shard->device_type() != c10::kCPU
                                        ? options_.device
                                        : c10::Device(c10::kCPU);
    r.grad_norm = optim::global_norm(local, groups_.shard.get(), norm_device);
  }
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    r.step = step_count_;
    FSDP_LOG0(kWarn) << "non-finite gradient norm (" << r.grad_norm
                     << "): optimizer step skipped, gradients dropped";
    zero_grad();
    current_order_.clear();
    return r;
  }
  r.clip_coef = optim::clip_coefficient(r.grad_norm, max_grad_norm);
  ++step_count_;
  if (options_.muon) {
    muon_step(lr, r.clip_coef);
    zero_grad();
    current_order_.clear();
    r.step = step_count_;
    return r;
  }
  optim::AdamWStep s{lr, step_count_ - optimizer_since_, r.clip_coef};
  // Device-resident state: all pieces of all units in one call (one fused kernel launch per
  // weight-decay value on a GPU). Host-resident state (CPU runs, --cpu-offload): unit by unit,
  // so the asynchronous copy of one unit's updated shard to the device (refresh_after_update)
  // overlaps the CPU step of the next unit.
  std::vector<optim::AdamWPiece> pieces;
  const auto flush = [&] {
    optim::adamw_update_all(pieces, options_.adamw, s, options_.adamw_impl);
    pieces.clear();
  };
  std::vector<FlatParam*> updated;
  for (const auto& u : units_) {
    if (!u->trainable) continue;
    FlatParam& f = *u->trainable;
    append_adamw_pieces(f, options_.adamw.weight_decay, pieces);
    if (f.master().device().is_cpu()) {
      flush();
      f.refresh_after_update();
    } else {
      updated.push_back(&f);
    }
  }
  flush();
  for (FlatParam* f : updated) f->refresh_after_update();
  zero_grad();
  current_order_.clear();
  r.step = step_count_;
  return r;
}

void ShardEngine::muon_step(double lr, double clip) {
  const optim::AdamWStep base{lr, step_count_ - optimizer_since_, clip};
  const optim::AdamWStep scaled{lr * options_.muon_lr_ratio, step_count_ - optimizer_since_, clip};
  int64_t index = 0;  // model-wide index of the Muon matrices (their owners)
  for (const auto& u : units_) {
    if (!u->trainable) continue;
    FlatParam& f = *u->trainable;
    const FlatLayout& layout = f.layout();
    std::vector<int> muon;
    for (size_t i = 0; i < layout.params.size(); ++i)
      if (optim::muon_group(layout.params[i].name, layout.params[i].shape) ==
          optim::MuonGroup::kMuon)
        muon.push_back(static_cast<int>(i));
    std::vector<optim::AdamWPiece> at_base, at_muon_lr;
    for (const ShardPiece& p : shard_pieces(layout, f.shard_rank())) {
      const ParamSlot& slot = layout.params.at(static_cast<size_t>(p.param));
      const optim::MuonGroup g = optim::muon_group(slot.name, slot.shape);
      if (g == optim::MuonGroup::kMuon) continue;
      const bool scaled_group = g == optim::MuonGroup::kAdamWAtMuonLr;
      const double wd = scaled_group ? options_.muon_options.weight_decay
                                     : (slot.decay ? options_.adamw.weight_decay : 0.0);
      (scaled_group ? at_muon_lr : at_base)
          .push_back({f.master().narrow(0, p.shard_offset, p.length),
                      f.grad_shard().narrow(0, p.shard_offset, p.length),
                      f.exp_avg().narrow(0, p.shard_offset, p.length),
                      f.exp_avg_sq().narrow(0, p.shard_offset, p.length), wd});
    }
    optim::adamw_update_all(at_base, options_.adamw, base, options_.adamw_impl);
    optim::adamw_update_all(at_muon_lr, options_.adamw, scaled, options_.adamw_impl);
    if (!muon.empty()) {
      // Muon sees the clipped gradient, as after torch's clip_grad_norm_.
      const at::Tensor grad = clip == 1.0 ? f.grad_shard() : f.grad_shard() * clip;
      muon_shard_step(layout, f.shard_rank(), groups_.shard.get(), f.master(), grad, f.exp_avg(),
                      muon, index, lr * options_.muon_lr_ratio, options_.muon_options);
      index += static_cast<int64_t>(muon.size());
    }
    f.refresh_after_update();
  }
}

MemoryStats ShardEngine::memory() const {
  MemoryStats m;
  for (FlatParam* f : flat_params()) {
    m.persistent_device_bytes += f->persistent_device_bytes();
    m.persistent_host_bytes += f->persistent_host_bytes();
    m.gathered_param_bytes += f->gathered_bytes();
    m.grad_buffer_bytes += f->grad_buffer_bytes();
  }
  m.peak_gathered_param_bytes = std::max(peak_gathered_, m.gathered_param_bytes);
  m.peak_grad_buffer_bytes = std::max(peak_grad_, m.grad_buffer_bytes);
  return m;
}

}  // namespace fsdp::shard
