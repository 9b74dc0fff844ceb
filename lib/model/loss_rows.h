// Which rows the TTT loss scores (docs/model.md "Loss rows"): the loss rows of a micro-batch,
// step i's rows among them, the chains and engine drafts the acceptance metrics follow, and a
// packed row's documents or a sequence-parallel rank's window. Built on the host from the loss
// mask alone: no model, no target, no device sync.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace fsdp::model {

// The rows each step's loss and accuracy read. Every term of ploss_i and acc_i is weighted by
// position_mask_i, which is zero wherever loss_mask_i is (docs/reference.md §4-5), so the draft
// lm_head and the target head only need the rows with loss_mask_i = 1: computing just those is
// exact, and on chat data (about a third of the tokens are the assistant's) it removes most of the
// lm_head work of the unroll. Built on the host, so the GPU path needs no device-to-host sync for
// it.
struct LossRows {
  int64_t batch = 0, seq = 0, ttt_length = 0;
  at::Tensor rows;                 // int64 [N]: b*S + t where loss_mask[b, t] = 1, ascending
  std::vector<at::Tensor> target;  // step i: int64 [N_i], indices into `rows` with t >= i
  std::vector<at::Tensor> draft;   // step i: int64 [N_i], the draft rows b*S + t - i they feed
  std::vector<int64_t> count;      // N_i = sum loss_mask_i (host)
  // int64 [N]: how many loss rows, from this one on, are consecutive positions of one sample,
  // capped at ttt_length (the all-anchor chains of StepOutput::accepted).
  at::Tensor run;
  // The engine's drafts (StepOutput::drafts). A reply is a run a..e of consecutive loss rows;
  // the draft made at draft row p proposes the tokens scored at rows p, p+1, ... (step i at
  // row p + i), and the engine's first draft of the reply is made at row a - 1 (docs/model.md).
  // pre: int64 [R], the rows b*S + a - 1 of the replies that have such a draft and a >= 1
  // (not loss rows: step 0's hit there is computed separately).
  at::Tensor pre;
  // The possible drafts ("nodes"): rows p = first..e-2 of every reply, M in all, in order.
  // engine_hit[i]: int64 [M], where node k's step-i hit is in cat(hit_i [N], pre hit_i [R],
  // 0): the loss row p + i, the pre row, or the trailing 0 when p + i is past e - 2 (the
  // tokens left in the reply). engine_end: int64 [M], the first node index past k's reply.
  // engine_start: int64 [K], each reply's first node.
  std::vector<at::Tensor> engine_hit;
  at::Tensor engine_end, engine_start;
  int64_t engine_nodes = 0;  // M (host)
  // Packed micro-batches (SeqLayout): the documents' lengths (host; empty unpacked), the
  // document of each loss row (int64 [N]), each document's length (fp32 [D]) and its loss rows
  // of step i (fp32 [T, D]). A document is a sample of its own: runs, replies and the rows of
  // step i (t - i inside the document) never cross its ends.
  std::vector<int64_t> documents;
  at::Tensor doc, doc_length, doc_count;
  bool packed() const { return !documents.empty(); }
  // Sequence-parallel (model/seq_parallel.h): this rank holds the draft positions [offset,
  // offset + local) of one sample of `total` tokens (B = 1) and the window [offset, offset +
  // seq) of its target side (seq = local + ttt_length - 1: step i at draft position t is scored
  // at t + i). Every row index above is then window-local (position - offset): rows are the
  // window's loss rows, step i's rows those whose draft position t - i is this rank's, pre the
  // replies' draft rows before them that are this rank's. Runs and replies are those of the
  // whole sample. The engine's drafts: engine_hit covers this rank's nodes only, global nodes
  // engine_first .. engine_first + engine_local - 1; engine_end, engine_start and engine_nodes
  // are the whole sample's (the ranks' accepted counts are summed before the chains are
  // followed). local_anchor: fp32 [N], 1 for rows at this rank's draft positions (the chains
  // this rank anchors). Unsharded: local = 0.
  int64_t shard_offset = 0, shard_local = 0, shard_total = 0;
  int64_t engine_first = 0, engine_local = 0;
  at::Tensor local_anchor;
  bool sharded() const { return shard_local > 0; }
  // loss_mask int64/bool [B, S]: on the host ideally (else one copy to the host); the index
  // tensors are placed on `device`. documents: a packed row's document lengths (B = 1, summing
  // to S), or empty.
  static LossRows build(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                        const std::vector<int64_t>& documents = {});
  // Sequence-parallel rows from the whole sample's loss_mask [1, total] (host): this rank's
  // draft positions [offset, offset + local), a window of local + ttt_length - 1 positions.
  static LossRows build_shard(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                              int64_t offset, int64_t local);
};

}  // namespace fsdp::model
