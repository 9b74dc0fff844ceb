// The engine's walk over a block draft's replies (model/block_acceptance.h).
#include "model/block_acceptance.h"

#include <ATen/ATen.h>

#include <unordered_map>

namespace fsdp::model {

at::Tensor accepted_prefix(const at::Tensor& pred, const at::Tensor& target,
                           const at::Tensor& valid, int64_t first) {
  const int64_t bs = pred.size(-1);
  const at::Tensor ok = (pred.eq(target) & valid).narrow(-1, first, bs - first).to(at::kLong);
  return at::cumprod(ok, -1).sum(-1);
}

EngineWalk engine_walk(const at::Tensor& loss_mask, const BlockLayout& layout,
                       const at::Tensor& accepted) {
  const at::Tensor mask = loss_mask.to(at::kCPU).gt(0.5).to(at::kByte).contiguous();
  const at::Tensor anchors = layout.anchors.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor keep = layout.keep.to(at::kCPU, at::kBool).contiguous();
  const at::Tensor acc = accepted.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = mask.size(0), S = mask.size(1), N = anchors.size(1);
  const uint8_t* m = mask.data_ptr<uint8_t>();
  const auto an = anchors.accessor<int64_t, 2>(), ac = acc.accessor<int64_t, 2>();
  const auto kp = keep.accessor<bool, 2>();
  EngineWalk w;
  for (int64_t b = 0; b < B; ++b) {
    std::unordered_map<int64_t, int64_t> at_anchor;
    for (int64_t j = 0; j < N; ++j) {
      if (kp[b][j]) at_anchor[an[b][j]] = ac[b][j];
    }
    const uint8_t* row = m + b * S;
    double row_accepted = 0, row_drafts = 0;
    bool complete = true;
    for (int64_t a = 0; a < S && complete; ++a) {
      if (!row[a] || (a > 0 && row[a - 1])) continue;  // not a reply's first position
      int64_t e = a;
      while (e + 1 < S && row[e + 1]) ++e;
      for (int64_t p = a; p + 1 <= e;) {
        const auto it = at_anchor.find(p);
        if (it == at_anchor.end()) {
          complete = false;
          break;
        }
        row_accepted += static_cast<double>(it->second);
        row_drafts += 1;
        p += it->second + 1;
      }
    }
    if (!complete) {
      ++w.rows_incomplete;
      continue;
    }
    ++w.rows_walked;
    w.accepted += row_accepted;
    w.drafts += row_drafts;
  }
  return w;
}

}  // namespace fsdp::model
