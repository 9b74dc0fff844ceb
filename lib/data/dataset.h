// Feature datasets behind one interface: SpecForge .ckpt / .ckpt.gz trees, native safetensors
// shards (bf16 or fp8), and the other producers' formats (data/formats.h). Opening lists files
// (or reads an index) but never opens a feature file; samples are read one at a time on demand,
// so step 1 never waits for the whole dataset.
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
  // Number of captured target layers the draft reads: aux_hidden_state must be [S, n*H]
  // (0: any n >= 1, as convert keeps what the producer captured).
  int64_t num_aux_layers = 3;
  // The feature contract of SpecForge's .ckpt files: the keys holding the target's last hidden
  // state and the captured layers. EAGLE3: hidden_state, aux_hidden_state. Block drafts:
  // target_last_hidden_states and hidden_states. They apply to .ckpt / .ckpt.gz files only: the
  // other formats keep their own names (speculators: hidden_states [S, L, H], last slot the
  // last state; ModelOpt: hidden_states, aux_hidden_states; DeepSpec: target_last_hidden_states,
  // target_hidden_states; native: hidden_state, aux_hidden_state).
  std::string hidden_key = "hidden_state";
  std::string aux_key = "aux_hidden_state";
  // Whether the algorithm reads the target's last hidden state (RawSample::hidden_state):
  //   kRequired: a sample without it is a BadSampleError naming the file and the key (EAGLE3,
  //     DSpark with a head that reads it);
  //   kOptional: kept where present, absent allowed (convert of block-draft .ckpt files);
  //   kUnused: never returned (DFlash): not read where the format allows, dropped elsewhere, so
  //     samples with and without it batch alike. Absent, the hidden size is hidden_size.
  enum class LastHidden { kRequired, kOptional, kUnused };
  LastHidden last_hidden = LastHidden::kRequired;
  // The draft's captured layers as 0-based decoder-layer output ids (SpecForge's convention),
  // when the algorithm has them in that convention (block drafts: dflash_config.target_layer_ids):
  // a dump that records its layers (FeatureDataset::captured_layer_ids: DeepSpec's manifest, a
  // native index converted from one) must hold exactly these, in order, or opening it fails
  // naming both lists. Empty: not checked at opening (EAGLE3 checks in its check_dataset).
  std::vector<int64_t> layer_ids = {};
  // The draft config key that names the captured layers, for messages.
  std::string layers_key = "eagle_aux_hidden_state_layer_ids";
};

// Token ids and loss mask of one sample (what vocab counting needs), both int64 [S].
struct TokenSample {
  at::Tensor input_ids;
  at::Tensor loss_mask;
};

class FeatureDataset {
 public:
  virtual ~FeatureDataset() = default;
  // The name its format registered under (data/formats.h: "ckpt", "native", "speculators",
  // "modelopt", "deepspec", ...).
  virtual std::string format() const = 0;
  virtual int64_t size() const = 0;
  // Reads, validates and normalises sample i (0 <= i < size()). Thread-safe. Throws
  // BadSampleError naming the file and the problem.
  virtual RawSample read(int64_t i) const = 0;
  // Sample i's input_ids and loss_mask whole, and the rows [from, from + count) (clipped to the
  // sample) of its hidden states, RawSample::row_offset = from; validated as read() validates
  // (the length check against the whole sample's). Native bf16 shards read only those rows'
  // bytes (a sequence-parallel rank's slice); the other formats read the whole sample and keep
  // the rows.
  virtual RawSample read_rows(int64_t i, int64_t from, int64_t count) const;
  // True when read_rows reads only the rows' bytes and read_tokens is cheap (native bf16/fp16
  // shards): the loader then reads a sequence-parallel rank's slice alone.
  virtual bool reads_rows() const { return false; }
  // Only input_ids and loss_mask of sample i (cheap for native shards; .ckpt loads and checks
  // the whole file, so a sample training would skip is not counted either).
  virtual TokenSample read_tokens(int64_t i) const = 0;
  // input_ids and loss_mask checked as read() checks them, the hidden states neither read nor
  // checked (a .ckpt file's hidden-state records stay on disk): for counts that only need the
  // tokens, such as the start-up loss-mask count.
  virtual TokenSample read_tokens_only(int64_t i) const { return read_tokens(i); }
  // True when read_tokens_only costs no file opening per sample (native shards), so start-up
  // counts may read every sample rather than a spaced subset.
  virtual bool cheap_tokens() const { return false; }
  // One file that changes whenever the dataset does (native: its index, which convert rewrites
  // with every shard), or "" when only every sample's source() can tell (vocabulary cache key).
  virtual std::string index_file() const { return ""; }
  // File (and shard key) that holds sample i.
  virtual std::string source(int64_t i) const = 0;
  // Where sample i comes from, relative to root() (a file, or a file plus a record), and its
  // size in bytes there: what `convert` plans shards by and records to resume.
  // (Defaults: source(i), and 0 bytes, which plans one sample per shard.)
  virtual std::string source_key(int64_t i) const { return source(i); }
  virtual uint64_t source_bytes(int64_t /*i*/) const { return 0; }
  // The dataset root as given.
  virtual const std::string& root() const = 0;
  // True when hidden_state holds the target's last layer BEFORE its final norm (speculators
  // stores it so); the trainer then applies the target's final RMSNorm before the target head.
  // SpecForge, ModelOpt (transformers dumps) and DeepSpec store it after the norm.
  virtual bool hidden_state_prenorm() const { return false; }
  // The captured target layers as the dump records them, as 0-based decoder-layer output ids
  // (SpecForge's convention), in aux_hidden_state order; empty when the dump does not say.
  virtual std::vector<int64_t> captured_layer_ids() const { return {}; }
  // Wakes and fails reads that wait for a sample to arrive (the streaming spool, data/spool.h),
  // when the loader shuts down; nothing for the datasets whose samples are all there.
  virtual void cancel_waits() const {}
  // Number of feature files opened so far (laziness checks and stats).
  int64_t files_opened() const { return files_opened_.load(); }
  // Bytes read from storage so far (as stored: compressed bytes for .ckpt.gz), for I/O checks.
  uint64_t bytes_read() const { return bytes_read_.load(); }

 protected:
  mutable std::atomic<int64_t> files_opened_{0};
  mutable std::atomic<uint64_t> bytes_read_{0};
};

// Opens `path` in the format the registry recognises there (data/formats.cpp, in detection
// order: a native index, then the producers' dumps, then a SpecForge tree of *.ckpt / *.ckpt.gz
// searched recursively, sorted by path, sample i = i-th path). Throws UsageError when the path
// does not exist, holds two formats of one stage, or holds no features (the message lists what
// every registered format is recognised by).
std::shared_ptr<FeatureDataset> open_feature_dataset(const std::string& path,
                                                     const DatasetOptions& options = {});

// All *.ckpt and *.ckpt.gz files under `dir`, recursively, sorted (the sample order of a .ckpt
// dataset).
std::vector<std::string> list_ckpt_files(const std::string& dir);

// The SpecForge .ckpt dataset over `files` (as list_ckpt_files returns them).
std::shared_ptr<FeatureDataset> open_ckpt_dataset(const std::string& root,
                                                  std::vector<std::string> files,
                                                  const DatasetOptions& options = {});

// Reads one SpecForge .ckpt file (torch.save zip of a dict, read by core/torch_archive_load.h:
// tensors and containers only, every record bounded, nothing ever executed) and validates it:
//   keys input_ids, loss_mask, hidden_state, aux_hidden_state must be present (others ignored);
//   input_ids/loss_mask: int64 (int32, and bool/uint8 for loss_mask, converted), shape [S] or
//   [1,S]; loss_mask values 0/1; hidden_state [1,S,H] or [S,H], aux [1,S,3H] or [S,3H], bf16
//   (fp16/fp32 accepted and converted to bf16); S > 0 and equal in all four; finite values.
// A path ending in .gz (SpecForge's --compress) is gunzipped into memory first (one sample at a
// time: gzip has no random access, so the whole file is decompressed even for the tokens).
// With `bytes_read`, stores how many bytes of the file were read.
RawSample read_ckpt_sample(const std::string& path, const DatasetOptions& options = {},
                           uint64_t* bytes_read = nullptr);

// The top-level keys of one .ckpt / .ckpt.gz file (its data.pkl only; no tensor is read), in
// file order: what `convert` looks at to tell EAGLE3 features from block-draft ones.
std::vector<std::string> read_ckpt_key_names(const std::string& path);

// Only input_ids and loss_mask of one .ckpt file, checked as read_ckpt_sample checks them: reads
// the zip directory, data.pkl and those two storage records, never the hidden states. With
// `bytes_read`, stores how many bytes of the file were read.
TokenSample read_ckpt_tokens(const std::string& path, const DatasetOptions& options = {},
                             uint64_t* bytes_read = nullptr);

// The token half of validate_sample (ids and mask: dtypes, shapes, lengths, 0/1 mask, id range),
// for the readers' tokens-only paths.
TokenSample validate_tokens_only(at::Tensor input_ids, at::Tensor loss_mask,
                                 const std::string& where, const DatasetOptions& options);

// Validates and normalises the four tensors of a sample already in memory (shared by the
// .ckpt and native readers and by convert). `where` names the input in errors.
// With rows (FeatureDataset::read_rows): hidden_state and aux_hidden_state hold rows
// [rows->from, ...) of tensors of rows->hidden / rows->aux rows in all, which must equal the
// tokens' length.
struct RowWindow {
  int64_t from = 0, hidden = 0, aux = 0;
};
RawSample validate_sample(at::Tensor input_ids, at::Tensor loss_mask, at::Tensor hidden_state,
                          at::Tensor aux_hidden_state, const std::string& where,
                          const DatasetOptions& options, const RowWindow* rows = nullptr);

}  // namespace fsdp::data
