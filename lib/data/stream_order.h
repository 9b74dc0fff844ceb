// The training order of a streaming run (docs/data.md "Streaming"): which arrival each position
// of the stream trains, when a position can be known, where the stream ends and which arrivals a
// checkpoint acknowledges. Pure arithmetic over the arrival count: no file access, so every rank
// computes the same answers from the same ledger.
//
// Arrivals a_0, a_1, ... are the samples in the order the trainer saw them complete. With one use
// per sample (uses = 1) position p trains a_p. With uses = K > 1 the arrivals form replay windows
// of R consecutive samples; window c trains its samples K times in a row, the first pass in
// arrival order and each later pass in a permutation drawn from (seed, c, pass), and only then
// does window c + 1 start: a sample's last use is at most R * K positions after its first. The
// last window may be shorter (the stream ended inside it). Positions are trained in rounds of
// `round` (micro-batch x data-parallel ranks, the sampler's stride): a round the stream cannot
// fill when it ends is not trained (as the sampler drops an incomplete last micro-batch).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace fsdp::data {

struct StreamOrderOptions {
  int64_t uses = 1;           // K >= 1
  int64_t replay_window = 1;  // R >= 1 (only matters when uses > 1)
  int64_t round = 1;          // positions per sampler round, >= 1
  uint64_t seed = 0;          // the later passes' permutations
};

class StreamOrder {
 public:
  explicit StreamOrder(StreamOrderOptions options);

  // What the arrivals known so far say about position p (p >= 0):
  //   kKnown: p trains arrival `arrival`;
  //   kWaiting: more arrivals are needed to know (at least `arrivals_needed` in all);
  //   kEnded: the stream ended before p (or p lies in the unfilled last round).
  enum class State { kKnown, kWaiting, kEnded };
  struct Lookup {
    State state = State::kWaiting;
    int64_t arrival = -1;
    int64_t arrivals_needed = 0;
  };
  Lookup at(int64_t position, int64_t arrivals, bool ended) const;

  // Positions the whole stream trains once it ended with `arrivals` samples (whole rounds only).
  int64_t trained_positions(int64_t arrivals) const;

  // Arrivals whose every use lies before `consumed` positions (a prefix of the arrivals: what a
  // checkpoint at `consumed` acknowledges). With `ended`, an arrival the stream will not train
  // (in the unfilled last round) counts as used once the trained positions are all consumed.
  int64_t acknowledged(int64_t consumed, int64_t arrivals, bool ended) const;

  const StreamOrderOptions& options() const { return options_; }

 private:
  // The arrival trained at offset `j` (< size * uses) of window `c` of `size` samples.
  int64_t in_window(int64_t c, int64_t size, int64_t j) const;
  StreamOrderOptions options_;
};

// The permutation of [0, n) for window c's pass (1-based later passes): Fisher-Yates over a
// std::mt19937_64 seeded from (seed, c, pass), the same on every platform.
std::vector<int64_t> replay_permutation(uint64_t seed, int64_t window, int64_t pass, int64_t n);

}  // namespace fsdp::data
