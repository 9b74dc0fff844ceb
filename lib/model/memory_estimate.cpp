// Closed-form training memory of one rank (model/memory_estimate.h). Every term counts what the
// code really holds (draft_model.cpp, ttt_attention.cpp, ttt_loss.cpp, target_head.cpp, the
// shard engine) and leaves out what it cannot know (allocator slack, LibTorch's own heap), so
// the figure stays below the measured peak: a refusal never stops a run that would fit.
#include "model/memory_estimate.h"

#include <unistd.h>

#include <algorithm>

#include "core/error.h"

namespace fsdp::model {
namespace {

using LD = long double;

LD layer_parameters(const DraftConfig& c) {
  const LD H = c.hidden_size, I = c.intermediate_size;
  const LD q = c.q_out_features(), kv = c.kv_out_features();
  return 2 * H * (q + 2 * kv) + q * H + 3 * H * I + 3 * H;  // q/k/v, o, MLP, the three norms
}

// Per token of one step, what the decoder layer keeps for backward when it is not checkpointed:
// the normed embedding (its weight's gradient), the fp32 copy and the normed output of the
// hidden-state and post-attention RMSNorms, the concatenated input of q/k/v, the rotated
// queries and keys and the values (the KV cache of later steps), the attention output and its
// fp32 log-sum-exp, the o_proj input, and the MLP's gate, SiLU, up and product tensors.
// A later layer of a multi-layer draft (docs/model.md "Draft variants") has no embedding input:
// no normed embedding, and its q/k/v input is H wide instead of 2H.
LD layer_bytes_per_token(const DraftConfig& c, LD b, bool first = true) {
  const LD H = c.hidden_size, I = c.intermediate_size;
  const LD q = c.q_out_features(), kv = c.kv_out_features(), nh = c.num_attention_heads;
  const LD all =
      b * H + 2 * (4 + b) * H + 2 * b * H + b * (q + 2 * kv) + b * q + 4 * nh + b * q + 4 * b * I;
  return first ? all : all - 2 * b * H;
}

}  // namespace

long double trainable_parameter_count(const DraftConfig& c) {
  return static_cast<LD>(count_parameters(c).trainable);
}

// Rows per chunk of the draft head for the plan's micro-batch (every token a loss row), 0 if
// unchunked.
int64_t plan_head_chunk(const DraftConfig& c, const MemoryPlan& p) {
  return head_chunk_rows(p.head_chunk_rows, p.micro_batch * p.local_tokens(), c.draft_vocab());
}

long double step_activation_bytes_per_token(const DraftConfig& c, const MemoryPlan& p) {
  const LD b = static_cast<LD>(p.compute_bytes);
  const LD H = c.hidden_size, Vd = c.draft_vocab(), kv = c.kv_out_features();
  // Final norm and lm_head on every row; the loss keeps the compute-dtype logits when it is
  // recomputed in backward (with activation checkpointing), else fp32 log_softmax and target p.
  // Chunked, the head keeps only its input rows and recomputes the rest in backward.
  const LD head = plan_head_chunk(c, p) > 0
                      ? b * H
                      : (4 + b) * H + (p.activation_checkpointing ? b * Vd : 8 * Vd);
  // Checkpointed: only each layer's inputs (the first: embedding and hidden state) and its K/V
  // cache entries.
  const LD later = static_cast<LD>(c.num_hidden_layers - 1);
  const LD layer = p.activation_checkpointing
                       ? 2 * b * H + 2 * b * kv + later * (b * H + 2 * b * kv)
                       : layer_bytes_per_token(c, b) + later * layer_bytes_per_token(c, b, false);
  return layer + head;
}

MemoryEstimate estimate_training_memory(const DraftConfig& c, const MemoryPlan& p) {
  const LD b = static_cast<LD>(p.compute_bytes);
  const LD H = c.hidden_size, Vd = c.draft_vocab(), V = c.vocab_size;
  const LD Ht = c.target_hidden();
  const LD shards = static_cast<LD>(std::max<int64_t>(p.shard_ranks, 1));
  const LD trainable = trainable_parameter_count(c);
  MemoryEstimate e;
  e.state = p.state_on_host ? 0 : 16 * trainable / shards;
  // A gathered unit: its compute-dtype parameters and gradient. The whole model stays gathered
  // from forward to backward without per-unit resharding.
  const LD largest_unit = std::max({H * c.num_aux_hidden_states * Ht, layer_parameters(c), Vd * H});
  e.compute = p.whole_compute_copy ? 2 * b * trainable : 2 * b * largest_unit;
  // Frozen: the embedding (a compute-dtype shard, gathered whole while it is used) and the
  // target's bf16 LM head, full [V, Ht] for the argmax and its [Vd, Ht] draft rows.
  e.frozen = b * V * H / shards + b * V * H + 2 * (V + Vd) * Ht;
  const LD tokens = static_cast<LD>(p.micro_batch) * static_cast<LD>(p.local_tokens());
  const LD T = static_cast<LD>(p.ttt_length);
  // Per token of the micro-batch, once: its features (bf16 hidden state and the three aux
  // layers, ids and mask), the fc output, and the fp32 target distribution over Vd.
  // Sequence-parallel, the all-to-all send and receive buffers of q, k, v and the attention
  // output of one layer use are transient too.
  const LD q = c.q_out_features(), kv = c.kv_out_features();
  const LD batch =
      2 * Ht + 6 * Ht + 16 + b * H + 4 * Vd + (p.seq_parallel > 1 ? 2 * b * (2 * q + 2 * kv) : 0);
  // The largest transient: the fp32 logits of a step's loss (of one chunk when chunked), and
  // the gradients of one layer step's activations in backward (with checkpointing also that
  // step recomputed).
  const int64_t chunk = plan_head_chunk(c, p);
  const LD logits = 4 * Vd * (chunk > 0 ? std::min<LD>(static_cast<LD>(chunk), tokens) : tokens);
  const LD transient = (p.activation_checkpointing ? 2 : 1) * layer_bytes_per_token(c, b);
  e.activations = tokens * (T * step_activation_bytes_per_token(c, p) + batch + transient) + logits;
  return e;
}

void check_training_memory(const DraftConfig& c, const MemoryPlan& p, uint64_t memory_bytes,
                           const std::string& device) {
  if (memory_bytes == 0) return;
  const MemoryEstimate e = estimate_training_memory(c, p);
  const LD ranks = static_cast<LD>(std::max<int64_t>(p.ranks_sharing_memory, 1));
  if (ranks * e.total() <= static_cast<LD>(memory_bytes)) return;
  const std::string per_rank = ranks > 1
                                   ? str(" per rank, x ", p.ranks_sharing_memory,
                                         " ranks sharing it = ", format_gib(ranks * e.total()))
                                   : std::string();
  throw_usage_error(
      __FILE__, __LINE__,
      str("draft config ", c.source, " (hidden_size ", c.hidden_size, ", intermediate_size ",
          c.intermediate_size, ", draft_vocab_size ", c.draft_vocab(), ", vocab_size ",
          c.vocab_size, ") with --max-length ", p.max_length,
          p.seq_parallel > 1
              ? str(" (", p.local_tokens(), " per rank at --sp-ulysses-size ", p.seq_parallel, ")")
              : std::string(),
          ", micro-batch ", p.micro_batch, ", --ttt-length ", p.ttt_length,
          ", activation checkpointing ", p.activation_checkpointing ? "on" : "off", ", draft head ",
          plan_head_chunk(c, p) > 0 ? str("in chunks of ", plan_head_chunk(c, p), " rows")
                                    : std::string("unchunked"),
          " needs at least ", format_gib(e.total()), per_rank, " (model state ",
          format_gib(e.state), " sharded over ", p.shard_ranks, " rank(s), gathered parameters ",
          format_gib(e.compute), ", frozen weights ", format_gib(e.frozen), ", activations ",
          format_gib(e.activations), "), more than the ", format_gib(memory_bytes), " of ", device),
      "lower --max-length or --draft-micro-batch-size (raise --gradient-accumulation-steps to "
      "keep the batch), turn on --activation-checkpointing, chunk the draft head "
      "(--head-chunk-rows 1024), split each sample over a sequence-parallel group "
      "(--sp-ulysses-size; `fsdp-train memory-plan` gives the size), or shard the state over more "
      "ranks "
      "(--sharding-strategy full_shard, more GPUs or nodes); docs/troubleshooting.md 'Memory "
      "estimate' has the formula");
}

std::string format_gib(long double bytes) {
  return str(static_cast<double>(bytes / (1024.0L * 1024 * 1024)), " GiB");
}

uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

}  // namespace fsdp::model
