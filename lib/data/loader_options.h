// The options of the data loader (data/loader.h) and of the aux hidden-state noise it adds
// (data/noise.h): plain structs with their defaults, the ranges they accept and a validate() that
// checks them, as torch's optimizer options do. The trainer builds them from the run
// configuration (train/component_options.h), and the option table takes the bounds of
// --max-length, --loader-threads and --noise-std from here. Torch-free; never reads the
// configuration, the option table or the environment.
#pragma once

#include <cstdint>

namespace fsdp::data {

// kUniform: U(-std, std), speculators' AddUniformNoise (2 * (rand - 0.5) * std), whose standard
// deviation is std / sqrt(3); kGaussian: N(0, std^2), speculators' AddGaussianNoise.
enum class NoiseType { kUniform, kGaussian };

struct NoiseOptions {
  // Above this the noise drowns the hidden states it is added to (speculators' default is 0.05).
  static constexpr double kMaxStd = 100;

  double std = 0;  // --noise-std: 0 turns noise off
  NoiseType type = NoiseType::kUniform;
  uint64_t seed = 0;  // the run's --seed
  bool enabled() const { return std > 0; }
  void validate() const;  // throws UsageError naming --noise-std
};

// The layout a draft family reads (LoaderOptions::layout): kShifted is process_sample's (EAGLE3),
// kBlock process_block_sample's (DFlash, DSpark); data/batch.h.
enum class SampleLayout { kShifted, kBlock };

struct LoaderOptions {
  // --max-length: a sample needs a token and its successor; the top keeps every product of a
  // length with a batch size far from overflowing.
  static constexpr int64_t kMinMaxLength = 2;
  static constexpr int64_t kMaxMaxLength = int64_t{1} << 20;
  static constexpr int kMaxThreads = 64;          // --loader-threads
  static constexpr int kMaxPrefetchDepth = 1024;  // micro-batches held ahead of the trainer

  int64_t max_length = 2048;      // --max-length: samples are truncated to this many tokens
  int prefetch_threads = 1;       // --loader-threads, resolved: background reader threads (>= 1)
  int prefetch_depth = 4;         // micro-batches read ahead of the trainer (>= 1)
  bool skip_bad_samples = false;  // --skip-bad-samples: replace bad samples by empty rows
  bool pin_memory = false;        // pin batch tensors (GPU hosts only)
  // A sample whose file cannot be opened or read (SampleReadError) is read again this many
  // times, after retry_delay_s, then twice that, ..., before it counts as bad: shared
  // filesystems have transient failures, and a multi-day run should not end on one.
  int read_retries = 3;
  double retry_delay_s = 1.0;
  // Noise added to each good sample's aux hidden state (data/noise.h); off by default, and the
  // trainer turns it on for the training loader only, never for evaluation.
  NoiseOptions noise;
  // How a sample is laid out for the draft (data/batch.h): shifted for EAGLE3, unshifted blocks
  // for DFlash and DSpark (no sequence parallelism).
  SampleLayout layout = SampleLayout::kShifted;
  // Sequence parallelism (data::slice_batch): this rank's place in its group and the window's
  // halo (ttt_length - 1); the sampler is then the data-parallel one, shared by the group.
  // Datasets that read rows alone (FeatureDataset::reads_rows, no noise): each rank reads its
  // window. Others: group rank 0 reads the sample whole and the others read nothing
  // (Batch::awaits_share), so a sample is read once per group.
  int sp_rank = 0, sp_size = 1;
  int64_t sp_halo = 0;
  // A stream (data/spool.h): the dataset may end before the sampler does (StreamEnded), and
  // next() marks the micro-batch after which it ended (Batch::ends_stream), so the trainer
  // closes its accumulation there. Where a micro-batch does not close an optimizer step of
  // `accumulation` micro-batches anyway, next() waits for the next one's verdict first (needs
  // prefetch_depth >= 2); where it does, it never waits for samples beyond the step.
  bool stream = false;
  int64_t accumulation = 1;
  void validate() const;  // throws UsageError naming the option
};

}  // namespace fsdp::data
