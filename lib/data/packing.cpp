// Exact sequence packing (packing.h).
#include "data/packing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace fsdp::data {
namespace {

// Item indices, longest first; equal lengths in index order.
std::vector<int64_t> longest_first(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  return order;
}

void check_items(const std::vector<int64_t>& lengths, int64_t budget) {
  for (const int64_t L : lengths) {
    FSDP_USAGE_CHECK(L >= 1 && L <= budget,
                     fsdp::str("packing: a sample of ", L, " tokens does not fit the budget of ",
                               budget, " tokens per micro-batch"),
                     "give --packing-budget at least --max-length (0 chooses max length x "
                     "micro-batch size)");
  }
}

// First-fit decreasing: bins of item indices, in the order items were placed.
std::vector<std::vector<int64_t>> first_fit(const std::vector<int64_t>& lengths, int64_t budget) {
  std::vector<std::vector<int64_t>> bins;
  std::vector<int64_t> load;
  for (const int64_t item : longest_first(lengths)) {
    const int64_t L = lengths[static_cast<size_t>(item)];
    size_t b = 0;
    while (b < bins.size() && load[b] + L > budget) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      load.push_back(0);
    }
    bins[b].push_back(item);
    load[b] += L;
  }
  return bins;
}

}  // namespace

std::vector<Sample> split_rows(const Batch& batch) {
  std::vector<Sample> out;
  const at::Tensor valid = batch.attention_mask.sum(1).to(at::kLong).contiguous();
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    const int64_t n = std::max<int64_t>(valid[b].item<int64_t>(), 1);
    Sample s;
    s.input_ids = batch.input_ids[b].narrow(0, 0, n);
    s.loss_mask = batch.loss_mask[b].narrow(0, 0, n);
    s.attention_mask = batch.attention_mask[b].narrow(0, 0, n);
    s.aux_hidden = batch.aux_hidden[b].narrow(0, 0, n);
    s.target_hidden = batch.target_hidden[b].narrow(0, 0, n);
    out.push_back(std::move(s));
  }
  return out;
}

int64_t count_bins(const std::vector<int64_t>& lengths, int64_t budget) {
  check_items(lengths, budget);
  return static_cast<int64_t>(first_fit(lengths, budget).size());
}

std::vector<std::vector<int64_t>> pack_bins(const std::vector<int64_t>& lengths, int64_t budget,
                                            int64_t bins) {
  check_items(lengths, budget);
  const auto n = static_cast<int64_t>(lengths.size());
  FSDP_CHECK(bins >= 1 && bins <= n,
             fsdp::str("packing: ", bins, " micro-batches for ", n, " samples"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  const auto finish = [](std::vector<std::vector<int64_t>> out) {
    for (auto& bin : out) std::sort(bin.begin(), bin.end());
    return out;
  };
  // Least-filled bin first: balanced micro-batches when it fits.
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(bins));
  std::vector<int64_t> load(static_cast<size_t>(bins), 0);
  bool fits = true;
  for (const int64_t item : longest_first(lengths)) {
    const int64_t L = lengths[static_cast<size_t>(item)];
    int64_t best = -1;
    for (int64_t b = 0; b < bins; ++b) {
      const auto k = static_cast<size_t>(b);
      if (load[k] + L <= budget && (best < 0 || load[k] < load[static_cast<size_t>(best)]))
        best = b;
    }
    if (best < 0) {
      fits = false;
      break;
    }
    out[static_cast<size_t>(best)].push_back(item);
    load[static_cast<size_t>(best)] += L;
  }
  if (fits) return finish(std::move(out));
  // First-fit decreasing needs at most `bins` bins; the missing ones take the last-placed (so
  // shortest) item of the bin holding most items until there are `bins`.
  out = first_fit(lengths, budget);
  FSDP_CHECK(static_cast<int64_t>(out.size()) <= bins,
             fsdp::str("packing: ", out.size(), " micro-batches needed, ", bins, " asked for"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  while (static_cast<int64_t>(out.size()) < bins) {
    size_t most = 0;
    for (size_t b = 1; b < out.size(); ++b)
      if (out[b].size() > out[most].size()) most = b;
    out.push_back({out[most].back()});
    out[most].pop_back();
  }
  return finish(std::move(out));
}

Batch collate_packed(const std::vector<Sample>& docs, bool pin_memory) {
  FSDP_CHECK(!docs.empty(), "collate_packed: no documents",
             "this is a bug in fsdp-train: please report it with the command line and log");
  const int64_t h = docs[0].target_hidden.size(1), w = docs[0].aux_hidden.size(1);
  Batch out;
  int64_t s = 0;
  for (const auto& x : docs) {
    FSDP_CHECK(x.target_hidden.size(1) == h && x.aux_hidden.size(1) == w,
               fsdp::str("collate: samples disagree on the hidden size (", h, " vs ",
                         x.target_hidden.size(1), ")"),
               "all feature files of a dataset must come from the same target model");
    out.documents.push_back(x.input_ids.size(0));
    s += x.input_ids.size(0);
  }
  auto opts = [&](at::ScalarType t) {
    auto o = at::TensorOptions().dtype(t);
    return pin_memory ? o.pinned_memory(true) : o;
  };
  out.input_ids = at::empty({1, s}, opts(at::kLong));
  out.loss_mask = at::empty({1, s}, opts(at::kLong));
  out.attention_mask = at::empty({1, s}, opts(at::kLong));
  out.aux_hidden = at::empty({1, s, w}, opts(at::kBFloat16));
  out.target_hidden = at::empty({1, s, h}, opts(at::kBFloat16));
  int64_t at = 0;
  for (const auto& x : docs) {
    const int64_t n = x.input_ids.size(0);
    out.input_ids[0].narrow(0, at, n).copy_(x.input_ids);
    out.loss_mask[0].narrow(0, at, n).copy_(x.loss_mask);
    out.attention_mask[0].narrow(0, at, n).copy_(x.attention_mask);
    out.aux_hidden[0].narrow(0, at, n).copy_(x.aux_hidden);
    out.target_hidden[0].narrow(0, at, n).copy_(x.target_hidden);
    at += n;
  }
  return out;
}

}  // namespace fsdp::data
