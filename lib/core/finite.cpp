// all_finite (core/finite.h).
#include "core/finite.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fsdp {

bool all_finite(const at::Tensor& t) {
  if (!t.is_floating_point()) return false;
  if (t.numel() == 0) return true;
  const auto [lo, hi] = at::aminmax(t);
  return std::isfinite(lo.item<double>()) && std::isfinite(hi.item<double>());
}

}  // namespace fsdp
