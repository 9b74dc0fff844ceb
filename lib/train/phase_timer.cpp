// Phase timing of the optimizer steps (phase_timer.h).
#include "train/phase_timer.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

namespace fsdp::train {

namespace {

comm::WaitPhase wait_phase_of(PhaseTimer::Phase p) {
  switch (p) {
    case PhaseTimer::kForward:
      return comm::WaitPhase::kForward;
    case PhaseTimer::kBackward:
      return comm::WaitPhase::kBackward;
    default:
      return comm::WaitPhase::kOptimizer;
  }
}

c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

PhaseTimer::PhaseTimer(c10::Device device, std::vector<comm::Communicator*> comms)
    : device_(device), events_(!device.is_cpu()), comms_(std::move(comms)) {
  for (auto* c : comms_) {
    const auto e = c->stats().exposed();
    for (size_t i = 0; i < e.size(); ++i) exposed0_[i] += e[i];
  }
}

void PhaseTimer::begin(Phase p) {
  comm::set_wait_phase(wait_phase_of(p));
  if (!events_) {
    watch_.reset();
    return;
  }
  spans_.push_back({p, c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT),
                    c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT)});
  spans_.back().start.record(current_stream(device_));
}

void PhaseTimer::end(Phase p) {
  comm::set_wait_phase(comm::WaitPhase::kOther);
  if (!events_) {
    host_[p] += watch_.seconds();
    return;
  }
  spans_.back().stop.record(current_stream(device_));
}

PhaseTimer::Seconds PhaseTimer::take() {
  Seconds out;
  if (!events_) {
    out.phase = host_;
    host_ = {};
  } else {
    while (!spans_.empty() && spans_.front().stop.query()) {
      const Span& s = spans_.front();
      out.phase[s.phase] += s.start.elapsedTime(s.stop) / 1e3;
      spans_.pop_front();
    }
  }
  std::array<double, static_cast<size_t>(comm::WaitPhase::kCount)> now{};
  for (auto* c : comms_) {
    c->settle_exposed();
    const auto e = c->stats().exposed();
    for (size_t i = 0; i < e.size(); ++i) now[i] += e[i];
  }
  for (int p = 0; p < kPhases; ++p) {
    const size_t w = static_cast<size_t>(wait_phase_of(static_cast<Phase>(p)));
    const double waited = std::max(0.0, now[w] - exposed0_[w]);
    out.comm += waited;
    out.phase[p] = std::max(0.0, out.phase[p] - waited);
  }
  exposed0_ = now;
  return out;
}

}  // namespace fsdp::train
