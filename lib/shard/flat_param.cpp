// Flat parameter buffers (see flat_param.h). The full buffer is allocated once; releasing it
// frees the bytes of its StorageImpl and gathering refills the same StorageImpl, so tensors
// autograd saved (views of it) see the parameters again, as FSDP does with storage resize.
#include "shard/flat_param.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include "core/error.h"

namespace fsdp::shard {
namespace {

at::TensorOptions opts(c10::ScalarType t, c10::Device d) {
  return at::TensorOptions().dtype(t).device(d);
}

at::Tensor host_zeros(int64_t n, c10::ScalarType t, bool pinned) {
  at::Tensor x = at::zeros({n}, opts(t, c10::Device(c10::kCPU)));
  return pinned ? x.pin_memory() : x;
}

}  // namespace

FlatParam::FlatParam(FlatLayout layout, std::vector<at::Tensor> params,
                     const EngineOptions& options, comm::Communicator* shard_comm,
                     comm::Communicator* replicate_comm)
    : layout_(std::move(layout)),
      params_(std::move(params)),
      options_(options),
      shard_comm_(shard_comm),
      replicate_comm_(replicate_comm),
      shard_rank_(shard_comm ? shard_comm->rank() : 0),
      device_(options.device),
      compute_dtype_(options.mixed_precision.param_dtype) {
  FSDP_ASSERT(params_.size() == layout_.params.size(), "FlatParam: params/layout mismatch");
  FSDP_ASSERT(layout_.group_size == (shard_comm ? shard_comm->size() : 1),
              "FlatParam: layout group size differs from the shard group");
  c10::NoGradGuard no_grad;
  const int64_t n = layout_.shard_numel;
  const bool offload = options.cpu_offload && trainable();
  const bool pinned = offload && device_.is_cuda();
  const c10::ScalarType master_dtype = trainable() ? at::kFloat : compute_dtype_;
  master_ =
      offload ? host_zeros(n, master_dtype, pinned) : at::zeros({n}, opts(master_dtype, device_));

  // This rank's pieces of every parameter go into its shard; the rest of each tensor is dropped.
  const auto pieces = shard_pieces(layout_, shard_rank_);
  for (const ShardPiece& p : pieces) {
    at::Tensor src = params_[p.param].detach().reshape({-1}).narrow(0, p.param_offset, p.length);
    master_.narrow(0, p.shard_offset, p.length).copy_(src);
  }
  if (trainable()) {
    grad_shard_ =
        offload ? host_zeros(n, at::kFloat, pinned) : at::zeros({n}, opts(at::kFloat, device_));
    exp_avg_ =
        offload ? host_zeros(n, at::kFloat, pinned) : at::zeros({n}, opts(at::kFloat, device_));
    exp_avg_sq_ =
        offload ? host_zeros(n, at::kFloat, pinned) : at::zeros({n}, opts(at::kFloat, device_));
    for (const ShardPiece& p : pieces) {
      const bool decay = layout_.params[p.param].decay;
      if (!runs_.empty() && runs_.back().decay == decay &&
          runs_.back().offset + runs_.back().length == p.shard_offset) {
        runs_.back().length += p.length;
      } else {
        runs_.push_back({p.shard_offset, p.length, decay});
      }
    }
  }
  // The all-gather input: the master itself when it already has the compute dtype and device.
  if (master_.scalar_type() == compute_dtype_ && master_.device() == device_) {
    compute_shard_ = master_;
  } else {
    compute_shard_ = master_.to(opts(compute_dtype_, device_));
  }

  full_ = at::empty({layout_.padded_numel}, opts(compute_dtype_, device_));
  writer_ = at::empty({0}, opts(compute_dtype_, device_));
  writer_.set_(full_.storage(), 0, {layout_.padded_numel}, {1});
  full_nbytes_ = static_cast<int64_t>(full_.storage().nbytes());
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& s = layout_.params[i];
    params_[i].set_data(full_.narrow(0, s.offset, s.numel).view(s.shape));
    params_[i].mutable_grad().reset();
  }
  free_storage();
}

void FlatParam::free_storage() {
  c10::StorageImpl* impl = full_.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, device_));
  impl->set_nbytes(0);
}

void FlatParam::allocate_storage() {
  c10::StorageImpl* impl = full_.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(impl->nbytes()) == full_nbytes_) return;
  impl->set_data_ptr_noswap(impl->allocator()->allocate(full_nbytes_));
  impl->set_nbytes(full_nbytes_);
}

void FlatParam::start_gather() {
  if (state_ != State::kFree) return;
  c10::NoGradGuard no_grad;
  allocate_storage();
  if (shard_comm_ && shard_comm_->size() > 1) {
    gather_work_ = shard_comm_->all_gather(compute_shard_, writer_);
    state_ = State::kInFlight;
  } else {
    writer_.copy_(compute_shard_);
    state_ = State::kReady;
  }
}

void FlatParam::wait_gather() {
  if (state_ == State::kFree) start_gather();
  if (state_ == State::kInFlight) {
    gather_work_->wait();
    gather_work_.reset();
    state_ = State::kReady;
  }
}

void FlatParam::release() {
  if (state_ == State::kInFlight) wait_gather();
  if (state_ == State::kFree) return;
  // A group of one keeps its buffer (freeing saves nothing); it stays valid until the master
  // changes (refresh_after_update).
  if (!shard_comm_ || shard_comm_->size() == 1) return;
  free_storage();
  state_ = State::kFree;
}

void FlatParam::refresh_after_update() {
  c10::NoGradGuard no_grad;
  if (!compute_shard_.is_same(master_)) compute_shard_.copy_(master_, /*non_blocking=*/true);
  release();
  state_ = State::kFree;  // groups of one: refill from the new shard on next use
}

void FlatParam::prepare_grads() {
  if (grad_full_.defined()) return;
  c10::NoGradGuard no_grad;
  grad_full_ = at::zeros({layout_.padded_numel}, opts(compute_dtype_, device_));
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& s = layout_.params[i];
    params_[i].mutable_grad() = grad_full_.narrow(0, s.offset, s.numel).view(s.shape);
  }
}

void FlatParam::adopt_grad(size_t i) {
  c10::NoGradGuard no_grad;
  at::Tensor g = params_[i].grad();
  if (!grad_full_.defined()) {
    // Autograd produced gradients without a pre-backward hook: move them into a flat buffer.
    std::vector<at::Tensor> existing;
    for (const auto& p : params_) existing.push_back(p.grad());
    prepare_grads();
    for (size_t j = 0; j < params_.size(); ++j) {
      if (existing[j].defined()) params_[j].mutable_grad().copy_(existing[j]);
    }
    return;
  }
  const ParamSlot& s = layout_.params[i];
  at::Tensor view = grad_full_.narrow(0, s.offset, s.numel).view(s.shape);
  if (g.defined() && g.data_ptr() != view.data_ptr()) {
    view.copy_(g);
    params_[i].mutable_grad() = view;
  }
}

void FlatParam::reduce_grads(bool sync) {
  FSDP_ASSERT(trainable(), "reduce_grads on a frozen buffer");
  FSDP_ASSERT(!pending_.defined(), "reduce_grads while a reduction is pending");
  c10::NoGradGuard no_grad;
  if (!grad_full_.defined()) prepare_grads();  // a unit whose parameters got no gradient
  for (auto& p : params_) p.mutable_grad().reset();
  at::Tensor grads = std::move(grad_full_);
  grad_full_ = at::Tensor();
  if (!sync) {
    if (!acc_full_.defined())
      acc_full_ = at::zeros({layout_.padded_numel}, opts(at::kFloat, device_));
    acc_full_.add_(grads);
    return;
  }
  if (acc_full_.defined()) {
    acc_full_.add_(grads);
    grads = std::move(acc_full_);
    acc_full_ = at::Tensor();
  }
  const c10::ScalarType rd = options_.mixed_precision.reduce_dtype;
  const bool communicates =
      (shard_comm_ && shard_comm_->size() > 1) || (replicate_comm_ && replicate_comm_->size() > 1);
  if (!communicates) {
    // Nothing to reduce over (one rank): finish_reduce adds the compute-dtype gradient into the
    // fp32 shard directly (the add widens each element as the cast would), without an fp32 copy
    // of the whole unit in between: the same values, one pass over the gradient fewer.
    pending_ = std::move(grads);
    return;
  }
  at::Tensor in = grads.scalar_type() == rd ? grads : grads.to(rd);
  grads = at::Tensor();
  if (shard_comm_ && shard_comm_->size() > 1) {
    pending_ = at::empty({layout_.shard_numel}, opts(rd, device_));
    reduce_work_ = shard_comm_->reduce_scatter(in, pending_, comm::ReduceOp::kAvg);
    pending_in_ = in;
  } else {
    pending_ = in;
  }
}

void FlatParam::finish_reduce() {
  if (!pending_.defined()) return;
  c10::NoGradGuard no_grad;
  if (reduce_work_) {
    reduce_work_->wait();
    reduce_work_.reset();
  }
  pending_in_ = at::Tensor();
  if (replicate_comm_ && replicate_comm_->size() > 1) {
    replicate_comm_->all_reduce(pending_, comm::ReduceOp::kAvg)->wait();
  }
  if (grad_shard_.device() == pending_.device()) {
    grad_shard_.add_(pending_);
  } else if (grad_shard_zero_) {
    // --cpu-offload, first contribution since zero_grad: one copy straight into the pinned host
    // shard (a DMA at the link's speed) rather than into a fresh pageable tensor plus a host
    // add; measured on an H200 host, the pageable route took 1.1 s per step for 1.7 GB.
    grad_shard_.copy_(pending_);
  } else {
    grad_shard_.add_(pending_.to(grad_shard_.device(), at::kFloat));
  }
  grad_shard_zero_ = false;
  pending_ = at::Tensor();
}

void FlatParam::zero_grad() {
  c10::NoGradGuard no_grad;
  if (grad_shard_.defined()) grad_shard_.zero_();
  grad_shard_zero_ = true;
  for (auto& p : params_) p.mutable_grad().reset();
  grad_full_ = at::Tensor();
  acc_full_ = at::Tensor();
}

namespace {
int64_t shard_state_bytes(const std::vector<const at::Tensor*>& ts) {
  int64_t b = 0;
  for (const at::Tensor* t : ts) b += t->defined() ? static_cast<int64_t>(t->nbytes()) : 0;
  return b;
}
}  // namespace

int64_t FlatParam::persistent_device_bytes() const {
  const bool host = options_.cpu_offload && trainable();
  int64_t b = host ? 0 : shard_state_bytes({&master_, &grad_shard_, &exp_avg_, &exp_avg_sq_});
  if (!compute_shard_.is_same(master_)) b += compute_shard_.nbytes();
  // A group of one keeps its full buffer for the whole run.
  if (!shard_comm_ || shard_comm_->size() == 1) b += full_nbytes_;
  return b;
}

int64_t FlatParam::persistent_host_bytes() const {
  if (!options_.cpu_offload || !trainable()) return 0;
  return shard_state_bytes({&master_, &grad_shard_, &exp_avg_, &exp_avg_sq_});
}

int64_t FlatParam::gathered_bytes() const {
  if (!shard_comm_ || shard_comm_->size() == 1) return 0;  // counted as persistent
  return static_cast<int64_t>(full_.storage().nbytes());
}

int64_t FlatParam::grad_buffer_bytes() const {
  int64_t b = 0;
  if (grad_full_.defined()) b += grad_full_.nbytes();
  if (acc_full_.defined()) b += acc_full_.nbytes();
  if (pending_in_.defined()) b += pending_in_.nbytes();
  return b;
}

}  // namespace fsdp::shard
