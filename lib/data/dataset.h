// Feature datasets: SpecForge .ckpt trees and native safetensors shards behind one interface.
// Opening lists files (and reads the native index) but never opens a feature file; samples are
// read one at a time on demand, so step 1 never waits for the whole dataset.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/batch.h"

namespace fsdp::data {

// A problem with one input sample (corrupt file, missing key, wrong dtype/shape, NaN/Inf, ...).
// It is a UsageError (exit code 2); --skip-bad-samples catches exactly this type.
class BadSampleError : public UsageError {
 public:
  using UsageError::UsageError;
};
// The file could not be opened or read (not: its content is wrong). On shared filesystems this
// can be transient, so the loader retries it before treating the sample as bad.
class SampleReadError : public BadSampleError {
 public:
  using BadSampleError::BadSampleError;
};

struct DatasetOptions {
  // Token ids must be < vocab_size when > 0 (catches features from another tokenizer).
  int64_t vocab_size = 0;
  // Expected hidden size H when > 0 (else taken from the first sample read).
  int64_t hidden_size = 0;
  // Scan hidden states for NaN/Inf (one pass over the bytes already in memory).
  bool check_finite = true;
};

// Token ids and loss mask of one sample (what vocab counting needs), both int64 [S].
struct TokenSample {
  at::Tensor input_ids;
  at::Tensor loss_mask;
};

class FeatureDataset {
 public:
  virtual ~FeatureDataset() = default;
  // "ckpt" or "native".
  virtual std::string format() const = 0;
  virtual int64_t size() const = 0;
  // Reads, validates and normalises sample i (0 <= i < size()). Thread-safe. Throws
  // BadSampleError naming the file and the problem.
  virtual RawSample read(int64_t i) const = 0;
  // Only input_ids and loss_mask of sample i (cheap for native shards; .ckpt loads and checks
  // the whole file, so a sample training would skip is not counted either).
  virtual TokenSample read_tokens(int64_t i) const = 0;
  // input_ids and loss_mask checked as read() checks them, the hidden states neither read nor
  // checked (a .ckpt file's hidden-state records stay on disk): for counts that only need the
  // tokens, such as the start-up loss-mask count.
  virtual TokenSample read_tokens_only(int64_t i) const { return read_tokens(i); }
  // File (and shard key) that holds sample i.
  virtual std::string source(int64_t i) const = 0;
  // The dataset root as given.
  virtual const std::string& root() const = 0;
  // Number of feature files opened so far (laziness checks and stats).
  int64_t files_opened() const { return files_opened_.load(); }

 protected:
  mutable std::atomic<int64_t> files_opened_{0};
};

// Opens `path`: a native dataset when it holds features.index.json, else a tree searched
// recursively for *.ckpt (sorted by path; sample i = i-th path). Throws UsageError when the
// path does not exist or holds no features.
std::shared_ptr<FeatureDataset> open_feature_dataset(const std::string& path,
                                                     const DatasetOptions& options = {});

// All *.ckpt files under `dir`, recursively, sorted (the sample order of a .ckpt dataset).
std::vector<std::string> list_ckpt_files(const std::string& dir);

// Reads one SpecForge .ckpt file (torch.save zip of a dict, read by core/torch_archive_load.h:
// tensors and containers only, every record bounded, nothing ever executed) and validates it:
//   keys input_ids, loss_mask, hidden_state, aux_hidden_state must be present (others ignored);
//   input_ids/loss_mask: int64 (int32, and bool/uint8 for loss_mask, converted), shape [S] or
//   [1,S]; loss_mask values 0/1; hidden_state [1,S,H] or [S,H], aux [1,S,3H] or [S,3H], bf16
//   (fp16/fp32 accepted and converted to bf16); S > 0 and equal in all four; finite values.
RawSample read_ckpt_sample(const std::string& path, const DatasetOptions& options = {});

// Only input_ids and loss_mask of one .ckpt file, checked as read_ckpt_sample checks them: reads
// the zip directory, data.pkl and those two storage records, never the hidden states. With
// `bytes_read`, stores how many bytes of the file were read.
TokenSample read_ckpt_tokens(const std::string& path, const DatasetOptions& options = {},
                             uint64_t* bytes_read = nullptr);

// Validates and normalises the four tensors of a sample already in memory (shared by the
// .ckpt and native readers and by convert). `where` names the input in errors.
RawSample validate_sample(at::Tensor input_ids, at::Tensor loss_mask, at::Tensor hidden_state,
                          at::Tensor aux_hidden_state, const std::string& where,
                          const DatasetOptions& options);

}  // namespace fsdp::data
