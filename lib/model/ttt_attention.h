// Attention of one TTT step (docs/reference.md §3.2): a query at (position t, step i) sees the
// step-0 keys at positions 0..t and the keys of steps 1..i at position t. Two implementations with
// the same contract: an efficient one (fused causal SDPA over step-0 keys, merged exactly with the
// i diagonal scores through the log-sum-exp; gradients exact) and a dense explicit-mask reference
// that materialises [B, nh, S, (i+1)S] scores (tests and benchmarks only). Never changes which keys
// a query sees; padding handling is identical in both.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "model/seq_parallel.h"

namespace fsdp::model {

// kFused: kEfficient with the diagonal merge and its backward in fsdp-train's own CUDA kernels
// (kernels/fused.h) where they apply (a CUDA tensor, head size <= 256, the steps within the
// kernel's shared memory); kEfficient's composite ops elsewhere.
enum class AttentionImpl { kEfficient, kDense, kFused };

// How the S positions of a micro-batch are laid out (docs/model.md "Packing"). Unpacked: each of
// the B rows is one sample, right-padded (attention_mask). Packed: one row (B = 1) holding whole
// documents back to back, `documents` their lengths in row order (summing to S, on the host):
// attention, positions and everything the loss reads stay inside each document, as if each were
// a micro-batch of its own. Converts implicitly from an attention mask (unpacked).
struct SeqLayout {
  SeqLayout() = default;
  SeqLayout(const at::Tensor& mask) : attention_mask(mask) {}  // NOLINT: implicit on purpose
  SeqLayout(const at::Tensor& mask, std::vector<int64_t> docs)
      : attention_mask(mask), documents(std::move(docs)) {}
  at::Tensor attention_mask;       // int64/bool [B, S]
  std::vector<int64_t> documents;  // packed: document lengths (host); empty: unpacked
  // Sequence-parallel (seq_parallel.h): this rank's slice of one sample; attention_mask is then
  // the slice's [1, local] mask. Never packed.
  std::shared_ptr<const SeqShard> shard;
  bool packed() const { return !documents.empty(); }
};

// Throws (naming the sizes) unless `layout` is unpacked, or packed with B = 1 and document
// lengths >= 1 summing to S.
void check_layout(const SeqLayout& layout, int64_t batch, int64_t seq);

// q [B, nh, S, d]; keys/values: one entry per step 0..i, each [B, nkv, S, d] (already rotated),
// nh a multiple of nkv (GQA: query head h uses kv head h / (nh / nkv)). layout.attention_mask
// int64/bool [B, S], right-padded (ones then zeros): keys at positions >= the valid length are
// never seen and query rows at those positions return zeros. Packed (layout.documents), a query
// sees only the step-0 keys of its own document (causal inside it). scale is usually 1/sqrt(d).
// Softmax is computed in fp32 (or the input dtype if wider). Returns [B, nh, S, d].
//
// The efficient path relies on right padding: for a valid query, causality already excludes
// the padded keys. Left-padded or holed masks need the dense path (check_right_padded()).
at::Tensor ttt_attention(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                         const std::vector<at::Tensor>& values, const SeqLayout& layout,
                         double scale, AttentionImpl impl = AttentionImpl::kEfficient);

// Packed, the fused kernel runs once per document (its causal part is exactly that document's
// own attention) and the diagonal merge is per position as unpacked.
// fused_merge: the diagonal merge in the CUDA kernels where they apply (AttentionImpl::kFused).
at::Tensor ttt_attention_efficient(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                                   const std::vector<at::Tensor>& values, const SeqLayout& layout,
                                   double scale, bool fused_merge = false);
at::Tensor ttt_attention_dense(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                               const std::vector<at::Tensor>& values, const SeqLayout& layout,
                               double scale);

// Throws fsdp::UsageError unless every row of mask [B, S] is ones followed by zeros. Reads the
// mask on the host (one device sync on GPU): call it where the data is produced or in tests.
void check_right_padded(const at::Tensor& attention_mask, const char* what = "attention_mask");

}  // namespace fsdp::model
