// Loss-mask counting and the start-up guard (data/loss_mask_stats.h).
#include "data/loss_mask_stats.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iomanip>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"

namespace fsdp::data {

int64_t sample_loss_tokens(const at::Tensor& loss_mask, int64_t max_length) {
  const int64_t s = std::min<int64_t>(loss_mask.numel(), std::max<int64_t>(max_length, 1));
  if (s <= 1) return 0;
  return loss_mask.reshape({-1}).narrow(0, 0, s - 1).eq(1).sum().item<int64_t>();
}

LossMaskCount count_loss_mask(const FeatureDataset& dataset, int64_t max_length,
                              comm::Communicator* comm) {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  LossMaskCount c;
  const int64_t n_all = dataset.size();
  // Only ids and masks are read (read_tokens_only), but every .ckpt sample is a file to open:
  // at most kMaxCountedCkptSamples of them, evenly spaced; every sample where tokens are cheap.
  const int64_t m = dataset.cheap_tokens() ? n_all : std::min(n_all, kMaxCountedCkptSamples);
  for (int64_t k = rank; k < m; k += world) {
    const int64_t i = m == n_all ? k : k * n_all / m;  // k < 4096: no overflow
    TokenSample s;
    try {
      s = dataset.read_tokens_only(i);
    } catch (const BadSampleError&) {
      ++c.unreadable;  // the vocabulary pass or the loader reports it (or stops the run)
      continue;
    }
    const int64_t n = std::min<int64_t>(s.loss_mask.numel(), std::max<int64_t>(max_length, 1));
    const int64_t loss = sample_loss_tokens(s.loss_mask, max_length);
    ++c.samples;
    c.tokens += n;
    c.loss_tokens += loss;
    if (loss == 0) ++c.zero_loss_samples;
  }
  if (comm && world > 1) {
    at::Tensor t = at::tensor(
        {c.samples, c.tokens, c.loss_tokens, c.zero_loss_samples, c.unreadable}, at::kLong);
    comm->all_reduce(t, comm::ReduceOp::kSum)->wait();
    const int64_t* p = t.data_ptr<int64_t>();
    c = {p[0], p[1], p[2], p[3], p[4]};
  }
  return c;
}

void check_loss_mask(const LossMaskCount& c, const std::string& flag, const std::string& path) {
  if (c.samples == 0) return;
  const std::string counts =
      fsdp::str(c.loss_tokens, " loss tokens in ", c.tokens, " tokens of ", c.samples, " samples (",
                c.zero_loss_samples, " samples without any)");
  const std::string hint =
      "check the chat template and the assistant-turn markers used when the features were "
      "generated, whether the data was preformatted (SpecForge's --is-preformatted), and the "
      "feature producer's loss-mask convention (1 = the token counts for the loss, as input_ids "
      "are given); see docs/data.md 'Loss masks'";
  FSDP_USAGE_CHECK(c.loss_tokens > 0,
                   fsdp::str(flag, " ", path, ": the loss mask is zero everywhere (", counts,
                             "): training would run at loss 0 and learn nothing"),
                   hint);
  FSDP_USAGE_CHECK(c.share() >= kMinLossTokenShare,
                   fsdp::str(flag, " ", path, ": only ", std::setprecision(3), 100.0 * c.share(),
                             "% of the tokens count for the loss (", counts,
                             "), below the minimum of ", 100.0 * kMinLossTokenShare, "%"),
                   hint);
}

int64_t zero_loss_rows(const Batch& batch) {
  if (!batch.loss_mask.defined() || batch.batch_size() == 0) return 0;
  // Sequence-parallel: the whole sample's mask, counted once per group (by its rank 0).
  if (batch.sharded() && batch.shard_rank != 0) return 0;
  const at::Tensor& mask = batch.sharded() ? batch.full_loss_mask : batch.loss_mask;
  const int64_t zero = mask.eq(1).sum(1).eq(0).sum().item<int64_t>();
  return std::max<int64_t>(zero - batch.num_skipped, 0);
}

}  // namespace fsdp::data
