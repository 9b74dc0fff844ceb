// Anchors, block tokens and labels of block drafts (model/block_targets.h).
#include "model/block_targets.h"

#include <ATen/ATen.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/hash.h"

namespace fsdp::model {

AnchorStream anchor_stream(uint64_t seed, int64_t epoch, int64_t sample_index) {
  // A domain constant keeps these keys apart from the noise's and anything else seeded with
  // --seed.
  constexpr uint64_t kDomain = 0x626c6f636b2d616eull;  // "block-an"
  return {mix64(mix64(seed ^ kDomain) ^ static_cast<uint64_t>(epoch)),
          static_cast<uint64_t>(sample_index)};
}

std::vector<int64_t> draw_anchors(const int64_t* mask, int64_t S, int64_t num_anchors,
                                  const AnchorStream& stream) {
  std::vector<int64_t> candidates;
  for (int64_t p = 0; p + 1 < S; ++p)
    if (mask[p] != 0 && mask[p + 1] != 0) candidates.push_back(p);
  if (static_cast<int64_t>(candidates.size()) <= num_anchors) return candidates;
  at::philox_engine rng(stream.key, stream.subsequence, /*offset=*/0);
  std::vector<uint64_t> keys(candidates.size());
  for (auto& k : keys) {
    const uint64_t hi = rng(), lo = rng();
    k = (hi << 32) | lo;
  }
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<int64_t> chosen;
  for (int64_t i = 0; i < num_anchors; ++i)
    chosen.push_back(candidates[order[static_cast<size_t>(i)]]);
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

BlockLayout sample_blocks(const at::Tensor& loss_mask_host, int64_t num_anchors, int64_t block_size,
                          const std::vector<AnchorStream>& streams, c10::Device device) {
  FSDP_CHECK(num_anchors > 0 && block_size >= 2, "sample_blocks: bad num_anchors or block_size",
             "this is a bug in fsdp-train: please report it");
  const at::Tensor mask = loss_mask_host.to(at::kLong).contiguous();
  const int64_t B = mask.size(0), S = mask.size(1);
  FSDP_CHECK(static_cast<int64_t>(streams.size()) == B,
             str("sample_blocks: ", streams.size(), " anchor streams for ", B, " rows"),
             "this is a bug in fsdp-train: please report it");
  std::vector<std::vector<int64_t>> rows;
  size_t width = 1;
  for (int64_t b = 0; b < B; ++b) {
    rows.push_back(draw_anchors(mask.data_ptr<int64_t>() + b * S, S, num_anchors,
                                streams[static_cast<size_t>(b)]));
    width = std::max(width, rows.back().size());
  }
  at::Tensor anchors = at::zeros({B, static_cast<int64_t>(width)}, at::kLong);
  at::Tensor keep = at::zeros({B, static_cast<int64_t>(width)}, at::kBool);
  auto a = anchors.accessor<int64_t, 2>();
  auto k = keep.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    for (size_t i = 0; i < r.size(); ++i) {
      a[b][static_cast<int64_t>(i)] = r[i];
      k[b][static_cast<int64_t>(i)] = true;
    }
  }
  BlockLayout l;
  l.anchors = anchors.to(device);
  l.keep = keep.to(device);
  l.context_len = S;
  l.block_size = block_size;
  return l;
}

at::Tensor block_input_ids(const at::Tensor& input_ids, const BlockLayout& layout,
                           int64_t mask_token_id) {
  const int64_t B = input_ids.size(0), N = layout.num_blocks(), bs = layout.block_size;
  const at::Tensor anchor_tokens = input_ids.gather(1, layout.anchors);  // [B, N]
  at::Tensor ids = at::full({B, N, bs}, mask_token_id, input_ids.options());
  ids.select(2, 0).copy_(
      at::where(layout.keep, anchor_tokens, at::full_like(anchor_tokens, mask_token_id)));
  return ids.view({B, N * bs});
}

BlockLabels dflash_labels(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                          const BlockLayout& layout) {
  const int64_t B = input_ids.size(0), S = input_ids.size(1), N = layout.num_blocks();
  const int64_t bs = layout.block_size;
  const auto opts = at::TensorOptions().dtype(at::kLong).device(input_ids.device());
  const at::Tensor offsets = at::arange(bs, opts).view({1, 1, bs});
  const at::Tensor index = layout.anchors.unsqueeze(-1) + offsets;  // [B, N, bs]
  const at::Tensor in_range = index < S;
  const at::Tensor safe = index.clamp_max(S - 1).view({B, N * bs});
  BlockLabels out;
  out.target_ids = input_ids.gather(1, safe).view({B, N, bs});
  const at::Tensor supervised = loss_mask.to(at::kFloat).gather(1, safe).view({B, N, bs});
  out.weight = layout.keep.unsqueeze(-1).to(at::kFloat) * in_range.to(at::kFloat) *
               (offsets > 0).to(at::kFloat) * supervised;
  return out;
}

}  // namespace fsdp::model
