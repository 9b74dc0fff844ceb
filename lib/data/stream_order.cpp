// The streaming run's training order (stream_order.h).
#include "data/stream_order.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"

namespace fsdp::data {

namespace {

// splitmix64's finaliser: mixes the window and pass numbers into the seed.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int64_t> replay_permutation(uint64_t seed, int64_t window, int64_t pass, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  std::mt19937_64 gen(mix(mix(seed ^ static_cast<uint64_t>(window)) ^ static_cast<uint64_t>(pass)));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

StreamOrder::StreamOrder(StreamOrderOptions options) : options_(options) {
  FSDP_CHECK(options_.uses >= 1 && options_.replay_window >= 1 && options_.round >= 1,
             str("stream order: uses ", options_.uses, ", window ", options_.replay_window,
                 ", round ", options_.round),
             "this is a bug in fsdp-train: please report it with the command line and log");
  // One use: every window is one sample (the arrival order itself).
  if (options_.uses == 1) options_.replay_window = 1;
}

int64_t StreamOrder::trained_positions(int64_t arrivals) const {
  const int64_t all = arrivals * options_.uses;
  return all / options_.round * options_.round;
}

int64_t StreamOrder::in_window(int64_t c, int64_t size, int64_t j) const {
  const int64_t pass = j / size, k = j % size;
  if (pass == 0) return c * options_.replay_window + k;
  return c * options_.replay_window +
         replay_permutation(options_.seed, c, pass, size)[static_cast<size_t>(k)];
}

StreamOrder::Lookup StreamOrder::at(int64_t position, int64_t arrivals, bool ended) const {
  Lookup out;
  if (ended && position >= trained_positions(arrivals)) {
    out.state = State::kEnded;
    return out;
  }
  const int64_t r = options_.replay_window, span = r * options_.uses;
  const int64_t c = position / span, j = position % span;
  const int64_t first = c * r;
  if (first + r <= arrivals) {  // a whole window
    out.state = State::kKnown;
    out.arrival = in_window(c, r, j);
  } else if (ended) {  // the stream's last, shorter window (position < trained positions)
    out.state = State::kKnown;
    out.arrival = in_window(c, arrivals - first, j);
  } else if (j < r && first + j < arrivals) {  // the first pass follows the arrivals
    out.state = State::kKnown;
    out.arrival = first + j;
  } else {
    out.arrivals_needed = j < r ? first + j + 1 : first + r;
  }
  return out;
}

int64_t StreamOrder::acknowledged(int64_t consumed, int64_t arrivals, bool ended) const {
  if (ended && consumed >= trained_positions(arrivals)) return arrivals;
  const int64_t windows = consumed / (options_.replay_window * options_.uses);
  return std::min(windows * options_.replay_window, arrivals);
}

}  // namespace fsdp::data
