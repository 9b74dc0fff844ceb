// One training step of the draft model (docs/reference.md §3.2 + §5): the test-time-training unroll
// over T steps, the weighted soft cross-entropy against the target distribution, and the accuracy
// metrics. Returns the loss to backward and detached metrics as tensors (no host sync), with
// numerators and denominators so the trainer can all-reduce them exactly across ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "model/draft_model.h"
#include "model/target_head.h"
#include "model/ttt_attention.h"

namespace fsdp::model {

// How ploss_i is normalised (docs/reference.md §5).
enum class LossNormalization {
  kBatchTokens,  // 1/(B*S), padded positions counted: SpecForge-compatible default
  kValidTokens,  // 1/max(sum position_mask_i, 1): per valid token
};

// Per-row objectives between the target distribution p (target_p over the draft vocabulary) and
// the draft's q = softmax(z) (docs/model.md "Loss functions"); names as speculators' --loss-fn.
enum class LossTerm {
  kSoftCE,     // soft_ce: -sum p log q (SpecForge's, the default)
  kKL,         // kl_div: sum p (log p - log q) (soft_ce minus p's entropy: same gradients)
  kReverseKL,  // rkl: sum q (log q - log p)
  kJSD,        // jsd: (KL(p||m) + KL(q||m)) / 2, m = (p + q) / 2
  kTV,         // tv: 1 - sum min(p, q) (total variation; 1 - the acceptance rate)
  kNLA,        // nla: -log max(sum min(p, q), 1e-5) (negative log acceptance)
  kHardCE,     // ce: -log q[argmax p] (speculators' "ce": hard labels)
  kLKHybrid,   // lk_hybrid: w KL + (1 - w)(1 - a), w = exp(-3 a) with a = sum min(p, q) detached
};
const char* loss_term_name(LossTerm t);
// "soft_ce", "kl_div", ... or a JSON object of weights ('{"kl_div": 0.5, "tv": 0.5}'). Throws
// UsageError naming the spec (unknown names, negative or non-finite weights, all weights 0).
std::vector<std::pair<LossTerm, double>> parse_loss_spec(const std::string& spec);
// The per-row values [N] of one objective, in z's precision (z: logits in fp32 or fp64 [N, Vd],
// p: [N, Vd] in the same dtype, each row summing to 1).
at::Tensor row_loss(LossTerm term, const at::Tensor& z, const at::Tensor& p);

struct LossOptions {
  int64_t ttt_length = 7;          // T
  int64_t accumulation_steps = 1;  // loss is divided by this
  double step_decay = 0.8;         // weight of step i is step_decay^i
  // The objective: a weighted sum of per-row terms; empty means soft_ce alone (the fused,
  // recomputing soft cross-entropy path).
  std::vector<std::pair<LossTerm, double>> loss_terms;
  // SpecForge's LK objectives (docs/model.md "Loss functions"), replacing the step's loss:
  // alpha: -mean_t log a_t; lambda: w ploss_i + (1 - w)(1 - mean_t a_t), w = kl_scale *
  // exp(-kl_decay * mean_t a_t) held constant in the gradient; a_t = sum_v min(p_on_draft, q),
  // means over the step's position rows of the micro-batch.
  enum class LK { kNone, kAlpha, kLambda } lk = LK::kNone;
  double kl_scale = 1.0, kl_decay = 1.0;
  LossNormalization normalization = LossNormalization::kBatchTokens;
  AttentionImpl attention = AttentionImpl::kEfficient;
  TargetImpl target = TargetImpl::kTiled;
  int64_t vocab_tile = 0;  // target-head argmax tile (0 = automatic)
  // Memory-lean loss: each step's graph keeps only its logits and recomputes log_softmax and
  // the target rows in backward (bit-identical values and gradients; 8 bytes per logit less
  // held, about 2% more step time on the CPU). The trainer turns it on with
  // --activation-checkpointing.
  bool recompute_loss = false;
  // fsdp-train's CUDA kernels (--fused-cuda-kernels, kernels/fused.h) for the soft cross-entropy
  // over the draft vocabulary, forward and backward, where they apply (CUDA logits in fp32, bf16
  // or fp16, soft_ce alone); the TTT attention's merge kernels come with AttentionImpl::kFused.
  // Supersedes recompute_loss: the fused forward keeps the logits and two floats per row.
  bool fused_kernels = false;
  // The chunked head and loss (docs/model.md "Chunked head and loss"): each step's norm,
  // lm_head, objective, argmax and acceptance run over chunks of this many loss rows and
  // backward recomputes each chunk's logits, so the step keeps its [N_i, H] input rows instead
  // of [N_i, Vd] logits (values and gradients equal within fp32 rounding; metrics the same).
  // 0: automatic (model/memory_estimate.h head_chunk_rows), -1: off. Supersedes recompute_loss.
  int64_t head_chunk_rows = 0;
  // Check shapes/dtypes of the batch (cheap, no sync). check_padding additionally verifies
  // right padding of attention_mask on the host (one sync on GPU).
  bool check_padding = false;
  // Sequence parallelism (model/seq_parallel.h): the group the rows' shard belongs to (a
  // LossRows::build_shard batch needs it; unsharded batches ignore it).
  SeqGroup* seq_group = nullptr;
};

struct StepOutput {
  // scalar, requires grad: what backward runs, objective * P / accumulation (P: the
  // sequence-parallel group's size, 1 without it).
  at::Tensor loss;
  // scalar, detached, in the logits' precision (fp32, fp64 for double logits): the objective this
  // micro-batch trained, sum_i step_decay^i * ploss_i with ploss_i as the options say (every
  // loss term and mix, LK, the normalisation); packed: summed over the documents;
  // sequence-parallel: this rank's share, the group's shares summing to the sample's. The
  // logged train/loss and eval/loss are its sum over micro-batches and ranks over `units`'s.
  at::Tensor objective;
  at::Tensor ploss;  // fp32 [T], detached, normalised as the options say
  at::Tensor acc;    // fp32 [T], detached: correct / max(loss_tokens, 1e-6)
  // fp32 [T]: the loss rows of step i where the draft's argmax, mapped to a target id through
  // the model's d2t (id + d2t[id]), is the target's full-vocabulary argmax: a "hit" (SpecForge
  // 0.2.0's accuracy). With a d2t that matches the target head's t2d this is exactly
  // sum [argmax z == argmax p] * position_mask_i; a wrong d2t shows as fewer hits.
  at::Tensor correct;
  at::Tensor loss_tokens;      // fp32 [T]: sum loss_mask_i (the acc denominator, unclamped)
  at::Tensor position_tokens;  // fp32 [T]: sum position_mask_i
  at::Tensor valid_tokens;     // int64 scalar: sum attention_mask (tokens/s accounting)
  // fp32 [T]: sum over position_mask_i rows of sum_v min(p_v, q_v), q the draft's softmax and
  // p the target's own (full-vocabulary softmax) probabilities of the draft tokens, target_p
  // times the draft vocabulary's mass (SpecForge 0.2.0's target_p_on_draft): the expected
  // acceptance of step i under speculative sampling; divided by position_tokens it is
  // acceptance_rate_i. Where the target gives no draft mass (a TargetDistribution without
  // draft_mass), the mass is taken as 1 and this equals accept_rate_renorm.
  at::Tensor accept_rate;
  // fp32 [T]: the same with p = target_p, renormalised over the draft vocabulary (at least
  // accept_rate; equal when the target's mass lies in the draft vocabulary):
  // acceptance_rate_renorm_i.
  at::Tensor accept_rate_renorm;
  // All-anchor chains (accept_len_all_anchors): a chain anchored at loss row t proposes step
  // i's prediction at draft row t, scored at row t + i, and keeps it while every earlier one
  // was a hit. anchors: fp32 scalar, the loss rows t whose next T-1 positions are loss rows of
  // the same sample (so every chain can reach length T). chain_hits: fp32 [T], the anchors
  // whose steps 0..i all hit. accepted: fp32 scalar, sum of chain_hits (the leading hits).
  at::Tensor accepted, anchors, chain_hits;
  // Engine-faithful chains (accept_len; docs/model.md "Acceptance length"): greedy chain
  // drafting of T tokens, one draft where the previous one ended, as vLLM and SGLang (top-k 1)
  // draft each reply (a run of consecutive loss rows). drafts: fp32 scalar, the drafts made;
  // draft_accepted: fp32 scalar, the tokens they accepted.
  at::Tensor draft_accepted, drafts;
  int64_t batch = 0, seq = 0;  // B and S of this micro-batch (the kBatchTokens normaliser)
  // The samples this output stands for: 1 for a micro-batch, the documents of a packed one, whose
  // ploss is then the sum of each document's own ploss (each normalised as a micro-batch of that
  // document alone would be) and batch_acc the sum of each document's acc (fp32 [T]; undefined
  // unpacked, where it is acc).
  int64_t units = 1;
  at::Tensor batch_acc;
};

// input_ids int64 [B,S] (already shifted), attention_mask int64 [B,S], loss_mask int64 [B,S],
// aux_hidden [B,S,3Ht], target_hidden [B,S,Ht] (any float dtype; cast to the model's compute
// dtype). The model's d2t/t2d must match the target head's t2d.
StepOutput ttt_step(Eagle3DraftImpl& model, const TargetHead& head, const at::Tensor& input_ids,
                    const at::Tensor& attention_mask, const at::Tensor& loss_mask,
                    const at::Tensor& aux_hidden, const at::Tensor& target_hidden,
                    const LossOptions& options = {});

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

// Same step with the rows precomputed from the host copy of loss_mask (the trainer's path).
StepOutput ttt_step(Eagle3DraftImpl& model, const TargetHead& head, const LossRows& rows,
                    const at::Tensor& input_ids, const at::Tensor& attention_mask,
                    const at::Tensor& loss_mask, const at::Tensor& aux_hidden,
                    const at::Tensor& target_hidden, const LossOptions& options = {});

// Same unroll from a precomputed dense target distribution (tests). When target.target_ids is
// undefined, the target id of a row is the argmax of target_p mapped through the model's d2t
// where position_mask is 1 (no target id elsewhere): the hits are then those of argmax p.
// documents: a packed row's document lengths (LossRows::build), or empty.
StepOutput ttt_step(Eagle3DraftImpl& model, const TargetDistribution& target,
                    const at::Tensor& input_ids, const at::Tensor& attention_mask,
                    const at::Tensor& loss_mask, const at::Tensor& aux_hidden,
                    const LossOptions& options = {}, const std::vector<int64_t>& documents = {});

// Draft logits of every step (no loss), e.g. for evaluation: T tensors [B, S, Vd].
std::vector<at::Tensor> ttt_logits(Eagle3DraftImpl& model, const at::Tensor& input_ids,
                                   const at::Tensor& attention_mask, const at::Tensor& aux_hidden,
                                   int64_t ttt_length, AttentionImpl impl);

// Shifts x [B, S, ...] left by n along dim 1, filling the last n columns with zeros.
at::Tensor shift_left(const at::Tensor& x, int64_t n);

}  // namespace fsdp::model
