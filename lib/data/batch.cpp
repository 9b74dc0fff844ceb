// Per-sample shifts and right-padding collate (batch.h, docs/reference.md §1.3).
#include "data/batch.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"

namespace fsdp::data {

uint64_t RawSample::nbytes() const {
  uint64_t n = 0;
  for (const auto* t : {&input_ids, &loss_mask, &hidden_state, &aux_hidden_state})
    if (t->defined()) n += t->numel() * t->element_size();
  return n;
}

int64_t Batch::num_loss_tokens() const {
  if (sharded()) return shard_rank == 0 ? full_loss_mask.sum().item<int64_t>() : 0;
  return loss_mask.defined() ? loss_mask.sum().item<int64_t>() : 0;
}

Sample process_sample(const RawSample& raw, int64_t max_length) {
  FSDP_CHECK(max_length >= 1, str("max_length must be >= 1, got ", max_length), "set --max-length");
  const int64_t s = std::min(raw.length(), max_length);
  FSDP_CHECK(s >= 1, raw.source + ": sample has no tokens",
             "regenerate this feature file (it has no input_ids) or remove it from the data set");
  const int64_t h = raw.hidden_size();
  Sample out;
  out.aux_hidden = raw.aux_hidden_state.narrow(0, 0, s).contiguous();
  // Shift left by one and append a zero row/element: position t holds the value of t+1.
  out.target_hidden = at::zeros({s, h}, raw.hidden_state.options());
  out.input_ids = at::zeros({s}, raw.input_ids.options());
  if (s > 1) {
    out.target_hidden.narrow(0, 0, s - 1).copy_(raw.hidden_state.narrow(0, 1, s - 1));
    out.input_ids.narrow(0, 0, s - 1).copy_(raw.input_ids.narrow(0, 1, s - 1));
  }
  out.loss_mask = raw.loss_mask.narrow(0, 0, s).clone();
  out.loss_mask[s - 1] = 0;
  out.attention_mask = at::ones({s}, raw.input_ids.options());
  return out;
}

Sample process_block_sample(const RawSample& raw, int64_t max_length) {
  FSDP_CHECK(max_length >= 1, str("max_length must be >= 1, got ", max_length), "set --max-length");
  const int64_t s = std::min(raw.length(), max_length);
  FSDP_CHECK(s >= 1, raw.source + ": sample has no tokens",
             "regenerate this feature file (it has no input_ids) or remove it from the data set");
  Sample out;
  out.input_ids = raw.input_ids.narrow(0, 0, s).clone();
  out.loss_mask = raw.loss_mask.narrow(0, 0, s).clone();
  out.attention_mask = at::ones({s}, raw.input_ids.options());
  out.aux_hidden = raw.aux_hidden_state.narrow(0, 0, s).contiguous();
  out.target_hidden = raw.hidden_state.defined()
                          ? raw.hidden_state.narrow(0, 0, s).contiguous()
                          : at::empty({s, 0}, raw.aux_hidden_state.options());
  return out;
}

Sample process_window(const RawSample& raw, int64_t max_length, int64_t offset, int64_t window) {
  FSDP_CHECK(
      max_length >= 1 && offset >= 0 && window >= 1,
      str("process_window: max_length ", max_length, ", window [", offset, ", +", window, ")"),
      "this is a bug in fsdp-train: please report it with the command line and log");
  const int64_t s = std::min(raw.length(), max_length);
  FSDP_CHECK(s >= 1, raw.source + ": sample has no tokens",
             "regenerate this feature file (it has no input_ids) or remove it from the data set");
  const int64_t rows = raw.hidden_state.size(0), from = raw.row_offset;
  // The rows this window reads: aux [offset, offset + window), hidden [offset + 1, ... + 1).
  const int64_t need_end = std::min(offset + window + 1, s);
  FSDP_CHECK(offset >= s || (from <= offset && from + rows >= need_end &&
                             raw.aux_hidden_state.size(0) == rows),
             str(raw.source, ": the window [", offset, ", ", need_end, ") is not inside the rows [",
                 from, ", ", from + rows, ") that were read"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  const int64_t h = raw.hidden_state.size(1), w = raw.aux_hidden_state.size(1);
  Sample out;
  out.aux_hidden = at::zeros({window, w}, raw.aux_hidden_state.options());
  out.target_hidden = at::zeros({window, h}, raw.hidden_state.options());
  out.input_ids = at::zeros({window}, raw.input_ids.options());
  out.loss_mask = at::zeros({window}, raw.loss_mask.options());
  out.attention_mask = at::zeros({window}, raw.input_ids.options());
  // Positions t in [offset, offset + n) exist; t + 1 < s for the shifted ones.
  const int64_t n = std::max<int64_t>(0, std::min(window, s - offset));
  const int64_t shifted = std::max<int64_t>(0, std::min(window, s - 1 - offset));
  if (n > 0) {
    out.aux_hidden.narrow(0, 0, n).copy_(raw.aux_hidden_state.narrow(0, offset - from, n));
    out.loss_mask.narrow(0, 0, n).copy_(raw.loss_mask.narrow(0, offset, n));
    out.attention_mask.narrow(0, 0, n).fill_(1);
    if (offset + n == s) out.loss_mask[n - 1] = 0;  // the sample's last token
  }
  if (shifted > 0) {
    out.target_hidden.narrow(0, 0, shifted)
        .copy_(raw.hidden_state.narrow(0, offset + 1 - from, shifted));
    out.input_ids.narrow(0, 0, shifted).copy_(raw.input_ids.narrow(0, offset + 1, shifted));
  }
  return out;
}

Sample empty_sample(int64_t hidden_size, int64_t aux_width) {
  FSDP_CHECK(hidden_size > 0 || aux_width > 0, "empty_sample needs the hidden size",
             "this is a bug in fsdp-train: please report it with the command line and log");
  Sample s;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  s.input_ids = at::zeros({1}, i64);
  s.loss_mask = at::zeros({1}, i64);
  s.attention_mask = at::zeros({1}, i64);
  s.aux_hidden = at::zeros({1, aux_width > 0 ? aux_width : 3 * hidden_size}, bf16);
  s.target_hidden = at::zeros({1, hidden_size}, bf16);
  return s;
}

Batch collate(const std::vector<Sample>& samples, bool pin_memory) {
  FSDP_CHECK(!samples.empty(), "collate: no samples",
             "this is a bug in fsdp-train: please report it with the command line and log");
  const int64_t b = static_cast<int64_t>(samples.size());
  const int64_t h = samples[0].target_hidden.size(1), w = samples[0].aux_hidden.size(1);
  int64_t s = 0;
  for (const auto& x : samples) {
    FSDP_CHECK(x.target_hidden.size(1) == h && x.aux_hidden.size(1) == w,
               str("collate: samples disagree on the hidden size (", h, " vs ",
                   x.target_hidden.size(1), ")"),
               "all feature files of a dataset must come from the same target model");
    s = std::max(s, x.input_ids.size(0));
  }
  auto opts = [&](at::ScalarType t) {
    auto o = at::TensorOptions().dtype(t);
    return pin_memory ? o.pinned_memory(true) : o;
  };
  Batch out;
  out.input_ids = at::zeros({b, s}, opts(at::kLong));
  out.loss_mask = at::zeros({b, s}, opts(at::kLong));
  out.attention_mask = at::zeros({b, s}, opts(at::kLong));
  out.aux_hidden = at::zeros({b, s, w}, opts(at::kBFloat16));
  out.target_hidden = at::zeros({b, s, h}, opts(at::kBFloat16));
  for (int64_t i = 0; i < b; ++i) {
    const auto& x = samples[i];
    const int64_t n = x.input_ids.size(0);
    out.input_ids[i].narrow(0, 0, n).copy_(x.input_ids);
    out.loss_mask[i].narrow(0, 0, n).copy_(x.loss_mask);
    out.attention_mask[i].narrow(0, 0, n).copy_(x.attention_mask);
    out.aux_hidden[i].narrow(0, 0, n).copy_(x.aux_hidden);
    out.target_hidden[i].narrow(0, 0, n).copy_(x.target_hidden);
  }
  return out;
}

Batch slice_batch(const Batch& batch, int rank, int size, int64_t halo, bool pin_memory) {
  FSDP_CHECK(batch.batch_size() == 1 && batch.documents.empty() && size >= 1 && rank >= 0 &&
                 rank < size && halo >= 0,
             str("slice_batch: a sequence-parallel slice needs one unpacked sample; got [",
                 batch.batch_size(), ", ", batch.seq_len(), "]",
                 batch.documents.empty() ? "" : " packed", ", rank ", rank, " of ", size),
             "sequence parallelism runs --draft-micro-batch-size 1 without --packing");
  const int64_t total = batch.seq_len();
  const int64_t local = std::max<int64_t>(1, (total + size - 1) / size);
  const int64_t offset = rank * local, window = local + halo;
  // Positions [offset, offset + window) that exist in the sample: [offset, offset + have).
  const int64_t have = std::max<int64_t>(0, std::min(window, total - offset));
  const auto cut = [&](const at::Tensor& t) {
    auto sizes = t.sizes().vec();
    sizes[1] = window;
    auto o = t.options();
    if (pin_memory) o = o.pinned_memory(true);
    at::Tensor out = at::zeros(sizes, o);
    if (have > 0) out.narrow(1, 0, have).copy_(t.narrow(1, offset, have));
    return out;
  };
  Batch out;
  out.input_ids = cut(batch.input_ids);
  out.loss_mask = cut(batch.loss_mask);
  out.attention_mask = cut(batch.attention_mask);
  out.aux_hidden = cut(batch.aux_hidden);
  out.target_hidden = cut(batch.target_hidden);
  out.shard_offset = offset;
  out.shard_local = local;
  out.shard_rank = rank;
  out.full_loss_mask = batch.loss_mask;
  out.sample_indices = batch.sample_indices;
  out.epoch = batch.epoch;
  out.batch_index = batch.batch_index;
  out.num_skipped = batch.num_skipped;
  out.bytes_read = batch.bytes_read;
  return out;
}

}  // namespace fsdp::data
