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
#include "model/loss_rows.h"
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
