// Prefetching loader (loader.h). Workers claim micro-batch numbers in order, build them off the
// trainer's thread and park them in a map keyed by batch number, so the trainer always receives
// batches in sampler order whatever the thread count. Never reads past prefetch_depth batches
// ahead of the trainer.
#include "data/loader.h"

#include <ATen/ATen.h>
#include <c10/util/ParallelGuard.h>

#include <chrono>
#include <sstream>

#include "core/log.h"
#include "core/timer.h"
#include "data/spool.h"

namespace fsdp::data {

DataLoader::DataLoader(std::shared_ptr<FeatureDataset> dataset, DistributedSampler sampler,
                       LoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  options_.validate();
  FSDP_CHECK(dataset_ && dataset_->size() == sampler_.num_samples(),
             str("loader: sampler covers ", sampler_.num_samples(), " samples, dataset has ",
                 dataset_ ? dataset_->size() : 0),
             "this is a bug in fsdp-train: please report it with the command line and log");
  read_mode_ = choose_read_mode();
}

DataLoader::~DataLoader() {
  dataset_->cancel_waits();  // a stream's readers may wait for samples that never come
  stop_threads();
}

void DataLoader::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void DataLoader::start(SamplerState state) {
  stop_threads();
  FSDP_USAGE_CHECK(state.position >= 0 && state.position <= batches_per_epoch(),
                   str("data position ", state.position, " is outside the epoch of ",
                       batches_per_epoch(), " micro-batches"),
                   "the checkpoint was written for another dataset, batch size or world size");
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;
  ++generation_;
  epoch_ = state.epoch;
  next_to_claim_ = next_to_return_ = state.position;
  ready_.clear();
  failed_.clear();
  ended_at_ = INT64_MAX;
  stream_ended_ = false;
  epoch_indices_ = sampler_.epoch_indices(epoch_);
  for (int i = 0; i < options_.prefetch_threads; ++i)
    threads_.emplace_back([this, i] { worker(i); });
}

RawSample DataLoader::read_with_retries(int64_t idx, int64_t from, int64_t count) {
  double delay = options_.retry_delay_s;
  for (int attempt = 0;; ++attempt) {
    try {
      return from >= 0 ? dataset_->read_rows(idx, from, count) : dataset_->read(idx);
    } catch (const SampleReadError& e) {
      if (attempt >= options_.read_retries) throw;
      FSDP_LOG(kWarn) << e.message() << ": reading it again in " << delay << " s (retry "
                      << attempt + 1 << " of " << options_.read_retries << ")";
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.read_retries;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      delay *= 2;
    }
  }
}

DataLoader::ReadMode DataLoader::choose_read_mode() const {
  if (options_.sp_size <= 1) return ReadMode::kWhole;
  // Rows alone only where the window is the whole story: one sample per micro-batch, and no
  // noise (which is drawn over the whole sample).
  if (sampler_.micro_batch_size() == 1 && dataset_->reads_rows() && !options_.noise.enabled())
    return ReadMode::kWindow;
  return options_.sp_rank == 0 ? ReadMode::kGroupReads : ReadMode::kGroupWaits;
}

// One micro-batch's samples as read, in row order; bad rows hold default Samples until
// fill_stand_ins. kWindow: the one sample's window and its whole loss mask.
struct DataLoader::BatchRead {
  std::vector<Sample> samples;
  std::vector<int64_t> indices, bad_rows;
  uint64_t bytes_read = 0;
  int64_t win_offset = 0, win_local = 0;
  at::Tensor full_mask;
};

Batch DataLoader::build_batch(int64_t epoch, int64_t batch) {
  if (read_mode_ == ReadMode::kGroupWaits) return awaiting_batch(epoch, batch);
  const int64_t b = sampler_.micro_batch_size();
  BatchRead read;
  for (int64_t k = 0; k < b; ++k) {
    const int64_t idx = epoch_indices_[batch * b + k];
    read.indices.push_back(idx);
    try {
      read.samples.push_back(read_mode_ == ReadMode::kWindow ? read_window(idx, read)
                                                             : read_whole(epoch, idx, read));
    } catch (const BadSampleError& e) {
      if (!options_.skip_bad_samples) throw;
      // A stream's producer may have died mid-write: said at once, on the rank that read it.
      if (options_.stream)
        FSDP_LOG(kWarn) << "--stream: skipped a bad sample (counted; training goes on): "
                        << e.message();
      std::lock_guard<std::mutex> lock(mu_);
      bad_.push_back({idx, dataset_->source(idx), e.message()});
      read.bad_rows.push_back(k);
      read.samples.emplace_back();  // filled by fill_stand_ins once the hidden size is known
    }
  }
  if (!read.bad_rows.empty()) fill_stand_ins(read.samples, read.bad_rows);
  return finish_batch(std::move(read), epoch, batch);
}

Batch DataLoader::awaiting_batch(int64_t epoch, int64_t batch) const {
  const int64_t b = sampler_.micro_batch_size();
  Batch out;
  out.sample_indices.assign(epoch_indices_.begin() + batch * b,
                            epoch_indices_.begin() + (batch + 1) * b);
  out.epoch = epoch;
  out.batch_index = batch;
  out.awaits_share = true;
  return out;
}

// Bytes read, and the hidden size and aux width of the first good sample (for stand-ins).
void DataLoader::note_read(const RawSample& raw, BatchRead& read) {
  read.bytes_read += raw.nbytes();
  std::lock_guard<std::mutex> lock(mu_);
  if (aux_width_ == 0) {
    hidden_size_ = raw.hidden_size();
    aux_width_ = raw.aux_hidden_state.size(1);
  }
}

Sample DataLoader::read_whole(int64_t epoch, int64_t idx, BatchRead& read) {
  RawSample raw = read_with_retries(idx);
  note_read(raw, read);
  Sample s = options_.layout == SampleLayout::kBlock
                 ? process_block_sample(raw, options_.max_length)
                 : process_sample(raw, options_.max_length);
  // Here the sample's identity (epoch, dataset index) is known and the work stays off the
  // trainer's thread; stand-ins for bad samples get no noise.
  s.aux_hidden = add_aux_noise(s.aux_hidden, options_.noise, epoch, idx);
  return s;
}

Sample DataLoader::read_window(int64_t idx, BatchRead& read) {
  const TokenSample tokens = dataset_->read_tokens(idx);
  const int64_t s = std::min(tokens.input_ids.size(0), options_.max_length);
  FSDP_CHECK(s >= 1, dataset_->source(idx) + ": sample has no tokens",
             "regenerate this feature file (it has no input_ids) or remove it");
  read.win_local = std::max<int64_t>(1, (s + options_.sp_size - 1) / options_.sp_size);
  read.win_offset = options_.sp_rank * read.win_local;
  const int64_t window = read.win_local + options_.sp_halo;
  RawSample raw = read_with_retries(idx, read.win_offset, window + 1);
  note_read(raw, read);
  read.full_mask = raw.loss_mask.narrow(0, 0, s).clone();
  read.full_mask[s - 1] = 0;  // as process_sample: the last token has no next one
  return process_window(raw, options_.max_length, read.win_offset, window);
}

// Empty rows for the bad samples, of the hidden size and aux width of a good one (this batch's,
// an earlier batch's, or else the next readable sample's).
void DataLoader::fill_stand_ins(std::vector<Sample>& samples,
                                const std::vector<int64_t>& bad_rows) {
  // The widths of a good sample (w > 0 marks one found; h is 0 for a block draft's features
  // without the target's last hidden state).
  int64_t h = 0, w = 0;
  for (const auto& s : samples) {
    if (s.target_hidden.defined()) {
      h = s.target_hidden.size(1);
      w = s.aux_hidden.size(1);
    }
  }
  if (w == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    h = hidden_size_;
    w = aux_width_;
  }
  // A whole batch of bad samples before any good one: the widths of the next readable sample.
  for (int64_t i = 0; w == 0 && i < dataset_->size(); ++i) {
    try {
      const RawSample r = dataset_->read(i);
      h = r.hidden_size();
      w = r.aux_hidden_state.size(1);
    } catch (const BadSampleError&) {
    }
  }
  FSDP_USAGE_CHECK(w > 0, dataset_->root() + ": every sample is bad", "fix the hidden-state files");
  for (int64_t k : bad_rows) samples[k] = empty_sample(h, w);
}

Batch DataLoader::finish_batch(BatchRead read, int64_t epoch, int64_t batch) const {
  // A window with a bad sample's stand-in is sliced like a whole sample (the same verdict on
  // every rank); a group's whole sample stays unpinned (share_batch slices and pins).
  const bool read_window = read_mode_ == ReadMode::kWindow && read.bad_rows.empty();
  const bool pin = options_.pin_memory && (read_mode_ == ReadMode::kWhole || read_window);
  Batch collated = collate(read.samples, pin);
  collated.sample_indices = std::move(read.indices);
  collated.bytes_read = read.bytes_read;
  collated.num_skipped = static_cast<int64_t>(read.bad_rows.size());
  collated.epoch = epoch;
  collated.batch_index = batch;
  if (read_window) {
    collated.shard_offset = read.win_offset;
    collated.shard_local = read.win_local;
    collated.shard_rank = options_.sp_rank;
    collated.full_loss_mask = read.full_mask.unsqueeze(0);
  } else if (read_mode_ == ReadMode::kGroupReads) {
    collated.awaits_share = true;
  } else if (read_mode_ == ReadMode::kWindow) {
    return slice_batch(collated, options_.sp_rank, options_.sp_size, options_.sp_halo,
                       options_.pin_memory);
  }
  return collated;
}

void DataLoader::worker(int id) {
  // Reader threads run their tensor ops on their own thread: a new thread would otherwise take
  // the trainer's intra-op width (16 on a 16-core GPU host), and several readers' thread teams
  // would compete with the thread that computes or launches the GPU work.
  c10::ParallelGuard serial(true);
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t gen = generation_;
  const int64_t total = batches_per_epoch();
  while (true) {
    cv_.wait(lock, [&] {
      return stop_ || next_to_claim_ >= std::min(total, ended_at_) ||
             next_to_claim_ < next_to_return_ + options_.prefetch_depth;
    });
    if (stop_ || next_to_claim_ >= std::min(total, ended_at_)) return;
    const int64_t batch = next_to_claim_++;
    const int64_t epoch = epoch_;
    lock.unlock();
    Stopwatch watch;
    Batch result;
    std::exception_ptr error;
    bool ended = false;
    try {
      result = build_batch(epoch, batch);
    } catch (const StreamEnded&) {
      ended = true;
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation_ != gen) return;
    stats_.read_seconds += watch.seconds();
    if (ended)
      ended_at_ = std::min(ended_at_, batch);
    else if (error)
      failed_[batch] = error;
    else
      ready_[batch] = std::move(result);
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  FSDP_CHECK(!threads_.empty() || next_to_return_ >= batches_per_epoch(),
             "DataLoader::next() before start()", "call start({epoch, position}) first");
  if (next_to_return_ >= batches_per_epoch()) return std::nullopt;
  const int64_t want = next_to_return_;
  Stopwatch watch;
  // Whether micro-batch k is decided: read, failed, or past a stream's end.
  const auto decided = [&](int64_t k) {
    return ready_.count(k) || failed_.count(k) || k >= ended_at_ || k >= batches_per_epoch();
  };
  const bool look_ahead = options_.stream && (want + 1) % options_.accumulation != 0;
  cv_.wait(lock, [&] { return decided(want) && (!look_ahead || decided(want + 1)); });
  const double waited = watch.seconds();
  stats_.data_wait_seconds += waited;
  wait_since_take_ += waited;
  if (want >= ended_at_) {
    stream_ended_ = true;
    return std::nullopt;
  }
  if (auto f = failed_.find(want); f != failed_.end()) {
    std::exception_ptr e = f->second;
    failed_.erase(f);
    // Move past the failed batch so a caller that handles the error cannot wait on it forever.
    ++next_to_return_;
    cv_.notify_all();
    std::rethrow_exception(e);
  }
  Batch b = std::move(ready_[want]);
  ready_.erase(want);
  // Without the look-ahead the step closes here anyway, and a later nullopt ends the epoch.
  b.ends_stream = look_ahead && want + 1 >= ended_at_;
  ++next_to_return_;
  ++stats_.batches;
  stats_.samples += b.batch_size() - b.num_skipped;
  stats_.bad_samples += b.num_skipped;
  stats_.bytes_read += b.bytes_read;
  cv_.notify_all();
  return b;
}

bool DataLoader::stream_ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_ended_;
}

SamplerState DataLoader::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {epoch_, next_to_return_};
}

LoaderStats DataLoader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

double DataLoader::take_data_wait_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  const double w = wait_since_take_;
  wait_since_take_ = 0;
  return w;
}

std::vector<BadSampleRecord> DataLoader::bad_samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bad_;
}

std::string DataLoader::bad_sample_summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (bad_.empty()) return "";
  std::ostringstream os;
  os << "skipped " << bad_.size() << " bad sample(s) (--skip-bad-samples):\n";
  for (const auto& b : bad_) os << "  sample " << b.index << ": " << b.problem << "\n";
  return os.str();
}

}  // namespace fsdp::data
