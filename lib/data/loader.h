// The data loader: background threads read and collate the rank's micro-batches in sampler
// order into a bounded queue, so the trainer only waits when I/O is slower than compute. Reads
// only the files of the batches it prefetches (never the whole dataset before step 1), and
// measures the time the trainer spends waiting for data.
#pragma once

#include <climits>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/loader_options.h"
#include "data/noise.h"
#include "data/sampler.h"

namespace fsdp::data {

struct BadSampleRecord {
  int64_t index = 0;
  std::string source;
  std::string problem;
};

struct LoaderStats {
  double data_wait_seconds = 0;  // trainer time blocked in next()
  double read_seconds = 0;       // summed over prefetch threads
  int64_t read_retries = 0;      // reads repeated after a SampleReadError
  int64_t batches = 0;           // batches handed to the trainer
  int64_t samples = 0;           // good samples in those batches
  int64_t bad_samples = 0;       // skipped samples (skip mode)
  uint64_t bytes_read = 0;       // raw feature bytes in those batches
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<FeatureDataset> dataset, DistributedSampler sampler,
             LoaderOptions options);
  ~DataLoader();  // stops and joins the prefetch threads
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts (or restarts) iteration at `state` (epoch, first micro-batch); prefetch begins now.
  void start(SamplerState state);
  // The next micro-batch of the current epoch in sampler order, or nullopt at the epoch's end.
  // Rethrows a read error (BadSampleError naming the file) for the batch that hit it, unless
  // skip mode replaced the bad sample. Not thread-safe (one consumer).
  std::optional<Batch> next();
  // A stream (LoaderOptions::stream) that ended: next() returned nullopt at its end.
  bool stream_ended() const;
  // Position to save in a checkpoint: the batches handed out so far (not the ones prefetched).
  SamplerState state() const;
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  const DistributedSampler& sampler() const { return sampler_; }
  const FeatureDataset& dataset() const { return *dataset_; }

  LoaderStats stats() const;
  // Seconds the trainer spent blocked in next() since the last call (then resets to 0); the
  // metrics code reports it as the data-loading share of step time.
  double take_data_wait_seconds();
  std::vector<BadSampleRecord> bad_samples() const;
  // One line per skipped sample plus a count, for the end-of-run summary ("" when none).
  std::string bad_sample_summary() const;

 private:
  void stop_threads();
  void worker(int id);
  // read(idx), or read_rows(idx, from, count) when from >= 0, retried on SampleReadError.
  RawSample read_with_retries(int64_t idx, int64_t from = -1, int64_t count = 0);

  // How this rank reads a micro-batch, chosen once at construction (options, dataset and
  // micro-batch size do not change afterwards):
  //   kWhole      no sequence parallelism: every sample read whole;
  //   kWindow     sequence-parallel on a dataset that reads rows alone (no noise, one sample
  //               per micro-batch): this rank's window only (data::process_window);
  //   kGroupReads sequence-parallel otherwise, group rank 0: the sample whole, for the group;
  //   kGroupWaits the group's other ranks: nothing (Batch::awaits_share).
  enum class ReadMode { kWhole, kWindow, kGroupReads, kGroupWaits };
  ReadMode choose_read_mode() const;
  struct BatchRead;  // what reading one micro-batch's samples produced (loader.cpp)
  Batch build_batch(int64_t epoch, int64_t batch);
  Batch awaiting_batch(int64_t epoch, int64_t batch) const;
  Sample read_whole(int64_t epoch, int64_t idx, BatchRead& read);
  Sample read_window(int64_t idx, BatchRead& read);
  void note_read(const RawSample& raw, BatchRead& read);
  void fill_stand_ins(std::vector<Sample>& samples, const std::vector<int64_t>& bad_rows);
  Batch finish_batch(BatchRead read, int64_t epoch, int64_t batch) const;

  std::shared_ptr<FeatureDataset> dataset_;
  DistributedSampler sampler_;
  LoaderOptions options_;
  ReadMode read_mode_ = ReadMode::kWhole;
  int64_t hidden_size_ = 0;  // learned from the first good sample; used for empty rows
  int64_t aux_width_ = 0;    // its aux_hidden_state width (n captured layers x H)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  int64_t epoch_ = 0;
  int64_t next_to_claim_ = 0;           // next batch a worker will read
  int64_t next_to_return_ = 0;          // next batch next() hands out
  int64_t generation_ = 0;              // bumped by start(); stale results are dropped
  std::vector<int64_t> epoch_indices_;  // the rank's sample order for epoch_
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> failed_;
  int64_t ended_at_ = INT64_MAX;  // the first micro-batch past a stream's end
  bool stream_ended_ = false;
  LoaderStats stats_;
  double wait_since_take_ = 0;
  std::vector<BadSampleRecord> bad_;
};

}  // namespace fsdp::data
