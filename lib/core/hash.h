// Stable 64-bit hashes (the same on every compiler, run and machine, unlike std::hash): FNV-1a
// for cache file names, splitmix64's finaliser for keying random streams by (seed, epoch,
// sample). Not for security or hash tables.
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

// splitmix64's finaliser: a bijection of 64-bit words that spreads every input bit.
inline constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace fsdp
