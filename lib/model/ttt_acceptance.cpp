// The TTT step's metrics (ttt_acceptance.h): per-step hits and acceptance sums, the chains
// anchored at every loss row and the engine's drafts, without a host sync.
#include "model/ttt_acceptance.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace fsdp::model {
namespace {

// sum_n pm_n * rows_n ([2]) over acceptance rows [2, n], summed in slices of
// accept_rate_chunk(vocab) rows (the slices the unchunked head computed them in).
at::Tensor sum_acceptance(const at::Tensor& rows, int64_t vocab, const at::Tensor& pm) {
  at::Tensor sum = at::zeros({2}, pm.options());
  const int64_t n = rows.size(1), chunk = accept_rate_chunk(std::max<int64_t>(vocab, 1));
  for (int64_t from = 0; from < n; from += chunk) {
    const int64_t len = std::min(chunk, n - from);
    sum = sum + (rows.narrow(1, from, len) * pm.narrow(0, from, len)).sum(-1);
  }
  return sum;
}

// The engine's drafts over LossRows' nodes (see LossRows::engine_hit): each node's accepted
// count n (leading hits), the jump to the node n + 1 rows later, and the nodes reached from
// each reply's first node, by pointer doubling (ceil(log2(M + 1)) gather/scatter rounds on the
// device, no host sync). Returns {sum of n over the reached nodes, number of reached nodes}.
//
// Sequence-parallel (group set): each rank counts its own nodes' n; the counts are summed over
// the group, every rank follows the chains of the whole sample and rank 0 reports them.
std::pair<at::Tensor, at::Tensor> engine_chains(const LossRows& rows,
                                                const std::vector<at::Tensor>& hits,
                                                const at::Tensor& pre_hit, SeqGroup* group) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(rows.rows.device());
  const int64_t M = rows.engine_nodes, T = static_cast<int64_t>(hits.size());
  if (M == 0) return {at::zeros({}, f32), at::zeros({}, f32)};
  const int64_t R = rows.pre.numel(), M_loc = group ? rows.engine_local : M;
  at::Tensor alive = at::ones({M_loc}, f32), n = at::zeros({M_loc}, f32);
  for (int64_t i = 0; i < T; ++i) {
    at::Tensor all = at::cat({hits[static_cast<size_t>(i)], i == 0 ? pre_hit : at::zeros({R}, f32),
                              at::zeros({1}, f32)});
    alive.mul_(all.index_select(0, rows.engine_hit[static_cast<size_t>(i)]));
    n.add_(alive);
  }
  if (group) {
    at::Tensor whole = at::zeros({M}, f32);
    whole.narrow(0, rows.engine_first, M_loc).copy_(n);
    group->all_reduce_sum(whole);
    n = whole;
  }
  const auto i64 = f32.dtype(at::kLong);
  at::Tensor next = at::arange(M, i64) + n.to(at::kLong) + 1;
  next = at::where(next.lt(rows.engine_end), next, at::full({}, M, i64));
  at::Tensor jump = at::cat({next, at::full({1}, M, i64)});  // node M: past every reply
  at::Tensor reached = at::zeros({M + 1}, f32).index_fill_(0, rows.engine_start, 1.0);
  for (int64_t span = 1; span <= M; span *= 2) {
    // Reached now: the nodes 0 .. 2*span-1 jumps after a first node.
    reached = reached.index_add(0, jump, reached).clamp_max_(1.0);
    jump = jump.index_select(0, jump);
  }
  at::Tensor drafts = reached.narrow(0, 0, M);
  if (group && group->rank() != 0) return {at::zeros({}, f32), at::zeros({}, f32)};
  return {(drafts * n).sum(), drafts.sum()};
}

}  // namespace

int64_t accept_rate_chunk(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t{1} << 24) / vocab);
}

at::Tensor acceptance_rows(const at::Tensor& logits, const at::Tensor& target_p,
                           const at::Tensor& draft_mass, const at::Tensor& take,
                           at::ScalarType acc) {
  at::Tensor q = logits.to(acc).softmax(-1);
  at::Tensor p = target_p.index_select(0, take).to(acc);
  at::Tensor renorm = at::minimum(p, q).sum(-1);
  if (!draft_mass.defined()) return at::stack({renorm, renorm});
  at::Tensor own = p * draft_mass.index_select(0, take).to(acc).unsqueeze(-1);
  return at::stack({at::minimum(own, q).sum(-1), renorm});
}

at::Tensor d2t_hits(const at::Tensor& best, const at::Tensor& d2t, const at::Tensor& target_ids) {
  return (best + d2t.index_select(0, best)).eq(target_ids);
}

AcceptanceMeter::AcceptanceMeter(const LossRows& rows, const RowsTarget& target, at::Tensor d2t,
                                 SeqGroup* group)
    : rows_(rows), target_(target), d2t_(std::move(d2t)), group_(group) {}

void AcceptanceMeter::add_pre(const at::Tensor& pre_best) {
  at::NoGradGuard guard;
  pre_hit_ = d2t_hits(pre_best, d2t_, target_.pre_ids).to(at::kFloat);
}

void AcceptanceMeter::add_step(int64_t i, const ScoredRows& scored, const at::Tensor& weight) {
  at::NoGradGuard guard;
  const at::Tensor& take = rows_.target[static_cast<size_t>(i)];
  // The cast to fp32 is exact, so the logits' own argmax is the fp32 one.
  at::Tensor hit =
      d2t_hits(scored.best, d2t_, target_.target_ids.index_select(0, take)).to(at::kFloat);
  correct_.push_back(hit.sum());
  if (rows_.packed()) {
    const at::Tensor doc = rows_.doc.index_select(0, take);
    const at::Tensor doc_hits =
        at::zeros({rows_.doc_length.numel()}, hit.options()).index_add(0, doc, hit);
    batch_acc_.push_back((doc_hits / rows_.doc_count[i].clamp_min(1e-6)).sum());
  }
  hits_.push_back(at::zeros({rows_.rows.numel()}, hit.options()).index_copy_(0, take, hit));
  const int64_t vocab = target_.target_p.size(-1);
  const at::Tensor accept =
      sum_acceptance(scored.accept, vocab, weight.to(scored.accept.scalar_type())).to(at::kFloat);
  accept_.push_back(accept[0]);
  accept_renorm_.push_back(accept[1]);
  loss_tokens_.push_back(
      at::scalar_tensor(static_cast<double>(rows_.count[static_cast<size_t>(i)]),
                        at::TensorOptions().dtype(at::kFloat).device(rows_.rows.device())));
  position_tokens_.push_back(weight.sum());
}

void AcceptanceMeter::write(StepOutput& res) const {
  const auto T = static_cast<int64_t>(hits_.size());
  res.correct = at::stack(correct_);
  res.loss_tokens = at::stack(loss_tokens_);
  res.position_tokens = at::stack(position_tokens_);
  res.accept_rate = at::stack(accept_);
  res.accept_rate_renorm = at::stack(accept_renorm_);
  res.acc = res.correct / res.loss_tokens.clamp_min(1e-6);
  if (rows_.packed()) {
    res.units = static_cast<int64_t>(rows_.documents.size());
    res.batch_acc = at::stack(batch_acc_);
  }
  if (group_) {
    // One sample per group: rank 0 counts it, and its per-sample acc from the group's sums.
    at::Tensor sums = at::cat({res.correct, res.loss_tokens}).to(at::kDouble).contiguous();
    group_->all_reduce_sum(sums);
    const bool first = group_->rank() == 0;
    res.units = first ? 1 : 0;
    res.batch_acc =
        first ? (sums.narrow(0, 0, T) / sums.narrow(0, T, T).clamp_min(1e-6)).to(at::kFloat)
              : at::zeros({T}, res.acc.options());
  }
  write_chains(res);
}

void AcceptanceMeter::write_chains(StepOutput& res) const {
  // Chains (StepOutput::accepted): step i of the chain anchored at loss row j is step i's hit
  // at row j + i, counted while the rows stay consecutive positions of one sample.
  at::NoGradGuard guard;
  const auto T = static_cast<int64_t>(hits_.size());
  const int64_t N = rows_.rows.numel();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(rows_.rows.device());
  // Chains that can reach length T (sequence-parallel: anchored at this rank's positions).
  at::Tensor full = rows_.run.ge(T).to(at::kFloat);
  if (group_) full = full * rows_.local_anchor;
  at::Tensor alive = at::ones({N}, f32);
  std::vector<at::Tensor> chain_hits;
  for (int64_t i = 0; i < T; ++i) {
    if (N == 0) {
      chain_hits.push_back(at::zeros({}, f32));
      continue;
    }
    const int64_t shift = std::min(i, N);
    at::Tensor at_i = i == 0 ? hits_[0]
                             : at::cat({hits_[static_cast<size_t>(i)].narrow(0, shift, N - shift),
                                        at::zeros({shift}, f32)});
    alive.mul_(at_i).mul_(rows_.run.gt(i));
    chain_hits.push_back((alive * full).sum());
  }
  res.chain_hits = at::stack(chain_hits);
  res.accepted = res.chain_hits.sum();
  res.anchors = full.sum();
  std::tie(res.draft_accepted, res.drafts) = engine_chains(rows_, hits_, pre_hit_, group_);
}

}  // namespace fsdp::model
