// Whether a tensor holds only finite values, in one read-only pass.
#pragma once

namespace at {
class Tensor;
}

namespace fsdp {

// True when every element is finite (empty: true; not floating point: false). One reduction
// (aminmax propagates NaN and +-Inf into its result) instead of isfinite's temporaries: a
// [128256, 4096] bf16 target head is checked in a fraction of a second, and each sample of
// hidden states as the loader reads it.
bool all_finite(const at::Tensor& t);

}  // namespace fsdp
