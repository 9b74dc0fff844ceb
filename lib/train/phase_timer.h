// Where the time of the optimizer steps goes (docs/usage.md "Time breakdown"): forward, backward
// and optimizer time, each net of the communication it waited for, and that exposed
// communication itself (comm::CommStats::exposed). Host stopwatches on the CPU; on a GPU, events
// recorded on the compute stream at the phase boundaries, read only when they have completed, so
// timing adds no synchronisation (the loop reads them after the log's metric reduction, which
// waits for the step anyway).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <array>
#include <deque>
#include <vector>

#include "comm/communicator.h"
#include "core/timer.h"

namespace fsdp::train {

class PhaseTimer {
 public:
  enum Phase { kForward = 0, kBackward, kOptimizer, kPhases };
  // `comms`: the engine's communicators, whose exposed waits are counted as communication.
  PhaseTimer(c10::Device device, std::vector<comm::Communicator*> comms);

  // Around each phase (not nested). Also tells the communicators which phase waits.
  void begin(Phase p);
  void end(Phase p);

  // Seconds since the last take(): each phase net of the communication it waited for, and that
  // communication (comm). On a GPU, phases whose events have not completed yet count in a later
  // take().
  struct Seconds {
    std::array<double, kPhases> phase{};
    double comm = 0;
  };
  Seconds take();

 private:
  struct Span {
    Phase phase;
    c10::Event start, stop;
  };
  c10::Device device_;
  bool events_;  // device timing (an accelerator); else host stopwatches
  std::vector<comm::Communicator*> comms_;
  Stopwatch watch_;
  std::array<double, kPhases> host_{};
  std::deque<Span> spans_;
  std::array<double, static_cast<size_t>(comm::WaitPhase::kCount)> exposed0_{};
};

}  // namespace fsdp::train
