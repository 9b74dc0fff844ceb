// Loss-mask guards (docs/data.md "Loss masks"): data whose loss mask is all (or almost all)
// zero trains at loss 0 and grad norm 0 without any error (SpecForge issue #392), so the trainer
// counts the loss tokens of each set at start-up and refuses such data, and counts the samples
// without a loss token in every epoch and evaluation.
#pragma once

#include <cstdint>
#include <string>

#include "data/batch.h"
#include "data/dataset.h"

namespace fsdp::comm {
class Communicator;
}

namespace fsdp::data {

// The smallest share of loss tokens among the tokens trained on that the trainer accepts: below
// it (0.1%), a wrong chat template or loss-mask convention is far more likely than real data.
inline constexpr double kMinLossTokenShare = 0.001;

// Each .ckpt sample is a file to open (only its input_ids and loss_mask records are read): the
// start-up count takes at most this many of them, evenly spaced (all of a smaller set, all of a
// native one).
inline constexpr int64_t kMaxCountedCkptSamples = 4096;

struct LossMaskCount {
  int64_t samples = 0;            // samples counted (readable ones)
  int64_t tokens = 0;             // positions trained on: min(S, max_length) per sample
  int64_t loss_tokens = 0;        // of those, positions whose loss counts (as in training)
  int64_t zero_loss_samples = 0;  // samples without a single loss token
  int64_t unreadable = 0;         // samples that could not be read (reported elsewhere)
  double share() const { return tokens > 0 ? static_cast<double>(loss_tokens) / tokens : 0.0; }
};

// Loss tokens of one sample as training sees them (data::process_sample): loss_mask[:s] with
// s = min(S, max_length), the last position never counting (it has no next token).
int64_t sample_loss_tokens(const at::Tensor& loss_mask, int64_t max_length);

// Counts over samples [0, N) of `dataset` (input_ids and loss_mask only, read_tokens_only); of
// a .ckpt dataset larger than kMaxCountedCkptSamples, over that many evenly spaced samples.
// With `comm`, each rank counts a strided subset and the counts are all-reduced (collective:
// every rank gets the same totals). A sample that cannot be read is counted as unreadable.
LossMaskCount count_loss_mask(const FeatureDataset& dataset, int64_t max_length,
                              comm::Communicator* comm = nullptr);

// Throws UsageError (exit 2) naming `flag` and the counts when the set has no loss token, or
// a share below kMinLossTokenShare. Nothing counted (every sample unreadable) passes: the
// loader reports those samples.
void check_loss_mask(const LossMaskCount& count, const std::string& flag, const std::string& path);

// Rows of a collated micro-batch whose loss_mask has no 1, not counting the rows that stand in
// for skipped bad samples (Batch::num_skipped).
int64_t zero_loss_rows(const Batch& batch);

}  // namespace fsdp::data
