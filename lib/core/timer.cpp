// Named time accumulators (core/timer.h).
#include "core/timer.h"

namespace fsdp {

void TimeAccumulator::add(const std::string& name, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = acc_[name];
  e.first += seconds;
  e.second += 1;
}

double TimeAccumulator::total(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = acc_.find(name);
  return it == acc_.end() ? 0.0 : it->second.first;
}

long TimeAccumulator::count(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = acc_.find(name);
  return it == acc_.end() ? 0 : it->second.second;
}

std::map<std::string, double> TimeAccumulator::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, double> out;
  for (const auto& [k, v] : acc_) out[k] = v.first;
  return out;
}

void TimeAccumulator::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  acc_.clear();
}

}  // namespace fsdp
