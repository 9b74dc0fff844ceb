// One training sample and one micro-batch as the trainer sees them (docs/reference.md §1.3): the
// per-sample shifts and truncation, and right-padding collate. Pure tensor code: no file access,
// no threads. Must never change the layout the model expects (see the Batch comment).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/loader_options.h"

namespace fsdp::data {

// A sample exactly as stored (after validation and dtype normalisation), S tokens:
//   input_ids int64 [S], loss_mask int64 [S] (0/1), hidden_state bf16 [S,H] (leading 1 of the
//   file's [1,S,H] removed), aux_hidden_state bf16 [S,nH] (n captured layers, 3 by default).
struct RawSample {
  at::Tensor input_ids;
  at::Tensor loss_mask;
  at::Tensor hidden_state;
  at::Tensor aux_hidden_state;
  // hidden_state and aux_hidden_state hold the rows [row_offset, row_offset + their size(0)) of
  // the sample (FeatureDataset::read_rows); 0 with every row (read()).
  int64_t row_offset = 0;
  std::string source;  // file (and key for native shards), for error messages
  int64_t length() const { return input_ids.defined() ? input_ids.size(0) : 0; }
  int64_t hidden_size() const { return hidden_state.defined() ? hidden_state.size(1) : 0; }
  uint64_t nbytes() const;
};

// A processed sample, S' = min(S, max_length) (docs/reference.md §1.3):
//   aux = aux_hidden_state[:S'], target_hidden = hidden_state[:S'] shifted left by one with a
//   zero row appended, input_ids = input_ids[:S'] shifted left by one with 0 appended,
//   loss_mask = loss_mask[:S'] (not shifted) with its last element forced to 0,
//   attention_mask = ones(S').
struct Sample {
  at::Tensor input_ids;       // int64 [S']
  at::Tensor loss_mask;       // int64 [S']
  at::Tensor attention_mask;  // int64 [S']
  at::Tensor aux_hidden;      // bf16 [S',3H]
  at::Tensor target_hidden;   // bf16 [S',H]
};

Sample process_sample(const RawSample& raw, int64_t max_length);

// A block draft's sample, S' = min(S, max_length), nothing shifted (the draft's blocks index the
// sequence themselves): input_ids, loss_mask and aux = the captured layers' hidden states
// [:S'], target_hidden = the target's last hidden state [:S'] (DSpark), or [S', 0] when the
// features have none (DFlash), attention_mask = ones(S').
Sample process_block_sample(const RawSample& raw, int64_t max_length);

// The window [offset, offset + window) of process_sample(raw, max_length), zeros past the
// sample's S' = min(S, max_length) tokens, from a raw sample that holds at least the hidden rows
// [offset, offset + window + 1) clipped to S' (FeatureDataset::read_rows; the + 1 is the shifted
// target). Equal to process_sample's rows, without reading or copying the others.
Sample process_window(const RawSample& raw, int64_t max_length, int64_t offset, int64_t window);

// A sample that contributes nothing to the loss (loss_mask and attention all zero, one token).
// Stands in for a skipped bad sample so every rank keeps the same batch count and shapes.
// aux_width: the aux_hidden width n*H of the dataset (0: 3*H). hidden_size 0 (with aux_width):
// a block draft's features without the target's last hidden state.
Sample empty_sample(int64_t hidden_size, int64_t aux_width = 0);

// A micro-batch, right-padded with zeros to the longest sample (B samples, S = max length):
//   input_ids int64 [B,S] (already shifted), loss_mask int64 [B,S], attention_mask int64 [B,S],
//   aux_hidden bf16 [B,S,3H], target_hidden bf16 [B,S,H] (already shifted).
// All on CPU (pinned when the loader was asked to pin); the trainer moves them to the device.
struct Batch {
  at::Tensor input_ids;
  at::Tensor loss_mask;
  at::Tensor attention_mask;
  at::Tensor aux_hidden;
  at::Tensor target_hidden;
  std::vector<int64_t> sample_indices;  // dataset indices, in row (packed: document) order
  // A packed micro-batch (data/packing.h): one row of whole documents, their lengths in order
  // (summing to seq_len()); empty for a right-padded micro-batch.
  std::vector<int64_t> documents;
  // Sequence-parallel (slice_batch): this rank's draft positions [shard_offset, shard_offset +
  // shard_local) of the one sample, whose tensors above hold the window of shard_local +
  // halo positions from shard_offset (zeros past the sample's end); full_loss_mask int64
  // [1, total] is the whole sample's. shard_local 0: not sharded.
  // shard_rank: this rank's place in its group (rank 0 counts the sample: num_loss_tokens,
  // zero_loss_rows).
  int64_t shard_offset = 0, shard_local = 0;
  int shard_rank = 0;
  at::Tensor full_loss_mask;
  bool sharded() const { return shard_local > 0; }
  // Sequence-parallel from a format read whole (.ckpt, ...): rank 0 of the group read the
  // sample (its tensors hold it unsliced), the other ranks read nothing (no tensors); the
  // trainer's train::share_batch hands every rank its slice.
  bool awaits_share = false;
  int64_t epoch = 0;
  int64_t batch_index = 0;   // position of this micro-batch within the rank's epoch
  bool ends_stream = false;  // a stream's last micro-batch (LoaderOptions::stream)
  int64_t num_skipped = 0;   // rows that stand in for skipped bad samples
  uint64_t bytes_read = 0;   // raw feature bytes read to build this batch
  int64_t batch_size() const { return input_ids.defined() ? input_ids.size(0) : 0; }
  int64_t seq_len() const { return input_ids.defined() ? input_ids.size(1) : 0; }
  // Tokens that count for the loss (sum of loss_mask; sharded: the sample's on group rank 0, 0
  // on the others).
  int64_t num_loss_tokens() const;
};

// Right-pads every tensor with zeros to the longest sample. Throws when samples disagree on the
// hidden size (naming both sizes) or when `samples` is empty.
Batch collate(const std::vector<Sample>& samples, bool pin_memory = false);

// Sequence parallelism: the slice of a one-sample batch that rank `rank` of `size` holds: the
// draft positions [offset, offset + local) with local = ceil(total / size) (at least 1) and
// offset = rank * local, and every tensor cut to the window [offset, offset + local + halo)
// (halo = ttt_length - 1: step i scores position t + i), zero-padded past the sample's end.
// Throws unless `batch` holds one unpacked sample.
Batch slice_batch(const Batch& batch, int rank, int size, int64_t halo, bool pin_memory = false);

}  // namespace fsdp::data
