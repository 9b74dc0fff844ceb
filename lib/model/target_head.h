// The target distribution of docs/reference.md §4, from the target model's LM head: target_p over
// the draft vocabulary (t2d rows only, softmax in fp32) and the full-vocab argmax that gates the
// loss, computed in vocabulary tiles so no [B, S, V] tensor ever exists. Never trains anything.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace fsdp::model {

enum class TargetImpl { kTiled, kDense };

struct TargetDistribution {
  at::Tensor target_p;       // fp32 [B, S + T, Vd]: rows S..S+T-1 are 1/Vd (step i: i..i+S-1)
  at::Tensor position_mask;  // int64 [B, S]: loss_mask * t2d[argmax_V target_logits] (step 0)
  at::Tensor target_ids;     // int64 [B, S]: argmax over the full target vocabulary
  // fp32 [B, S] (optional): the draft vocabulary's share of the full-vocabulary softmax; the
  // target's own probabilities of the draft tokens are target_p * draft_mass (SpecForge's
  // target_p_on_draft, which its LK losses use). Undefined: taken as 1.
  at::Tensor draft_mass;
};

// The same distribution on selected rows only (see LossRows in ttt_loss.h): row j is the
// flattened position rows[j] = b*S + t of the batch.
struct RowTarget {
  at::Tensor target_p;     // fp32 [N, Vd]
  at::Tensor target_ids;   // int64 [N]: argmax over the full target vocabulary
  at::Tensor in_draft;     // int64 [N]: t2d[target_ids] (position_mask where loss_mask is 1)
  at::Tensor target_best;  // int64 [N]: argmax of target_p (the draft-vocab id acc compares to)
  at::Tensor draft_mass;   // fp32 [N], with want_mass only (see TargetDistribution)
};

class TargetHead {
 public:
  TargetHead() = default;
  // lm_head_weight [V, H] (any float dtype; kept as given, usually bf16), t2d bool [V] with
  // exactly Vd true entries. The t2d rows are gathered once into a [Vd, H] matrix.
  TargetHead(const at::Tensor& lm_head_weight, const at::Tensor& t2d);

  // The tile width (vocabulary rows per matmul) chosen for `rows` hidden rows: one tile's
  // logits stay within 16 Mi elements, at least 1024 columns, at most the vocabulary, and a
  // multiple of 256 below it, so the logits' row stride keeps the alignment the GPU's
  // tensor-core GEMM kernels need (an odd width fell back to a kernel 8x slower on an H200).
  static int64_t auto_vocab_tile(int64_t rows, int64_t vocab);

  // target_hidden [B, S, H] (cast to the weight dtype), loss_mask int64 [B, S]. ttt_length T
  // is the number of padding rows. vocab_tile 0 = auto_vocab_tile. Runs without gradient.
  TargetDistribution compute(const at::Tensor& target_hidden, const at::Tensor& loss_mask,
                             int64_t ttt_length, TargetImpl impl = TargetImpl::kTiled,
                             int64_t vocab_tile = 0) const;

  // Only the rows `rows` (int64 [N], flat b*S + t) of target_hidden [B, S, H].
  // want_mass: also the draft vocabulary's probability mass (one more pass of exp over the
  // vocabulary tiles; SpecForge's LK losses need it).
  RowTarget compute_rows(const at::Tensor& target_hidden, const at::Tensor& rows,
                         TargetImpl impl = TargetImpl::kTiled, int64_t vocab_tile = 0,
                         bool want_mass = false) const;

  // Dense reference (tests, benchmarks): full [B, S, V] logits, softmax over t2d columns.
  TargetDistribution compute_dense(const at::Tensor& target_hidden, const at::Tensor& loss_mask,
                                   int64_t ttt_length) const;
  TargetDistribution compute_tiled(const at::Tensor& target_hidden, const at::Tensor& loss_mask,
                                   int64_t ttt_length, int64_t vocab_tile = 0) const;

  // Full-vocab argmax of hidden @ weight^T in tiles of `vocab_tile` rows; ties go to the
  // smallest id (as at::argmax). hidden [..., H] -> int64 [...].
  at::Tensor tiled_argmax(const at::Tensor& hidden, int64_t vocab_tile = 0) const;

  // Moves the weights (e.g. to the GPU); the dtype is kept.
  void to(c10::Device device);

  int64_t vocab_size() const { return weight_.defined() ? weight_.size(0) : 0; }
  int64_t draft_vocab_size() const { return draft_weight_.defined() ? draft_weight_.size(0) : 0; }
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& draft_weight() const { return draft_weight_; }
  const at::Tensor& t2d() const { return t2d_; }

 private:
  void check_hidden(const at::Tensor& target_hidden) const;
  // Full-vocab argmax [...] and, with want_lse, the fp32 full-vocab log-sum-exp [...] of
  // hidden @ weight^T, in one pass over the vocabulary tiles.
  std::pair<at::Tensor, at::Tensor> tiled_argmax_lse(const at::Tensor& hidden, int64_t vocab_tile,
                                                     bool want_lse) const;
  struct DraftLogits {
    at::Tensor logits;  // [..., Vd] in the weight dtype
    at::Tensor ids;     // [...] full-vocab argmax
    at::Tensor lse;     // [...] fp32 full-vocab log-sum-exp (want_lse only)
  };
  DraftLogits draft_logits_and_ids(const at::Tensor& hidden, TargetImpl impl, int64_t vocab_tile,
                                   bool want_lse = false) const;
  TargetDistribution compute_with(const at::Tensor& target_hidden, const at::Tensor& loss_mask,
                                  int64_t ttt_length, TargetImpl impl, int64_t vocab_tile) const;

  at::Tensor weight_;        // [V, H]
  at::Tensor draft_weight_;  // [Vd, H] = weight_[t2d]
  at::Tensor t2d_;           // bool [V]
};

}  // namespace fsdp::model
