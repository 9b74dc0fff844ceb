// FNV-1a: the stable 64-bit hash of cache file names (the same on every compiler, run and
// machine, unlike std::hash). Not for security or hash tables.
#pragma once

#include <cstdint>
#include <string_view>

namespace fsdp {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// Continues hash `h` (the offset basis to start) over the bytes of `s`.
inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aOffset) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace fsdp
