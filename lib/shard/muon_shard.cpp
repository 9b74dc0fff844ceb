// Muon on sharded parameters (shard/muon_shard.h).
#include "shard/muon_shard.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace fsdp::shard {

int muon_owner(int64_t index, int world) {
  FSDP_CHECK(world >= 1 && index >= 0, fsdp::str("muon_owner(", index, ", ", world, ")"),
             "this is a bug in fsdp-train: please report it");
  return static_cast<int>(index % world);
}

void muon_shard_step(const FlatLayout& layout, int rank, comm::Communicator* comm,
                     const at::Tensor& master, const at::Tensor& grad, const at::Tensor& momentum,
                     const std::vector<int>& muon_params, int64_t first_index, double lr,
                     const optim::MuonOptions& o) {
  at::NoGradGuard guard;
  const std::vector<ShardPiece> pieces = shard_pieces(layout, rank);
  const auto fp32 = master.options().dtype(at::kFloat);
  int64_t index = first_index;
  for (const int pi : muon_params) {
    const ParamSlot& slot = layout.params.at(static_cast<size_t>(pi));
    FSDP_CHECK(slot.shape.size() == 2, "Muon on parameter " + slot.name + " that is not 2-D",
               "only matrices go to Muon (optim::muon_group)");
    const ShardPiece* mine = nullptr;  // a parameter meets a shard in at most one piece
    for (const ShardPiece& p : pieces)
      if (p.param == pi) mine = &p;
    // This rank's slice: momentum and the Nesterov update are elementwise.
    at::Tensor update_slice;
    if (mine) {
      const at::Tensor g = grad.narrow(0, mine->shard_offset, mine->length);
      const at::Tensor m = momentum.narrow(0, mine->shard_offset, mine->length);
      m.lerp_(g, 1 - o.momentum);
      update_slice = o.nesterov ? g.lerp(m, o.momentum) : m;
    }
    // The whole update on every rank (zeros outside each slice: the sum is exact), then its
    // orthogonalisation on the owner, broadcast.
    at::Tensor whole = at::zeros({slot.numel}, fp32);
    if (mine) whole.narrow(0, mine->param_offset, mine->length).copy_(update_slice);
    if (comm) comm->all_reduce(whole, comm::ReduceOp::kSum)->wait();
    const int owner = muon_owner(index++, comm ? comm->size() : 1);
    // Sent as fp32 (the bf16 values exactly), whatever dtypes a backend takes.
    at::Tensor ortho = at::empty({slot.shape[0], slot.shape[1]}, fp32);
    if ((comm ? comm->rank() : 0) == owner)
      ortho.copy_(optim::newton_schulz(whole.view({slot.shape[0], slot.shape[1]}),
                                       o.ns_coefficients, o.ns_steps, o.eps, o.ns_fp32));
    if (comm) comm->broadcast(ortho, owner)->wait();
    if (!mine) continue;
    const double adjusted = optim::muon_adjusted_lr(lr, o.adjust_lr, slot.shape[0], slot.shape[1]);
    const at::Tensor p = master.narrow(0, mine->shard_offset, mine->length);
    p.mul_(1 - lr * o.weight_decay);
    p.add_(ortho.view({-1}).narrow(0, mine->param_offset, mine->length), -adjusted);
  }
}

}  // namespace fsdp::shard
