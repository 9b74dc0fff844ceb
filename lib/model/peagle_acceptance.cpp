// P-EAGLE's engine walk (model/peagle_acceptance.h).
#include "model/peagle_acceptance.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace fsdp::model {

PEagleWalk peagle_engine_walk(const at::Tensor& loss_mask, const at::Tensor& hits) {
  FSDP_CHECK(loss_mask.dim() == 2 && hits.dim() == 3 && hits.size(0) == loss_mask.size(0) &&
                 hits.size(2) == loss_mask.size(1),
             "peagle_engine_walk: loss_mask [B, S] and hits [B, K, S] expected",
             "pass the evaluation step's hits");
  const at::Tensor lm = loss_mask.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor h = hits.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = lm.size(0), S = lm.size(1), K = h.size(1);
  const int64_t* m = lm.data_ptr<int64_t>();
  const int64_t* x = h.data_ptr<int64_t>();
  PEagleWalk w;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* mb = m + b * S;
    for (int64_t a = 0; a < S; ++a) {
      if (mb[a] != 1 || (a > 0 && mb[a - 1] == 1)) continue;  // a: a reply's first position
      int64_t e = a;
      while (e + 1 < S && mb[e + 1] == 1) ++e;
      for (int64_t p = a > 0 ? a - 1 : 0; p + 2 <= e;) {
        int64_t n = 0;
        while (n < K && p + n + 2 <= e && x[(b * K + n) * S + p] == 1) ++n;
        w.drafts += 1;
        w.accepted += static_cast<double>(n);
        p += n + 1;
      }
      a = e;
    }
  }
  return w;
}

}  // namespace fsdp::model
