// EAGLE3's metrics as the trainer keeps them (train/step_metrics.h over algo::Eagle3Metrics),
// fed model::StepOutput directly: the tests of the metric sums and the logged loss use it.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"
#include "model/ttt_loss.h"
#include "train/algo/eagle3_metrics.h"
#include "train/step_metrics.h"

namespace fsdp::test {

class Eagle3StepMetrics {
 public:
  explicit Eagle3StepMetrics(
      int64_t ttt_length, c10::Device device = c10::Device(c10::kCPU),
      config::AccuracyAggregation aggregation = config::AccuracyAggregation::kPooled)
      : schema_(ttt_length, aggregation), sums_(schema_, device) {}
  Eagle3StepMetrics(const Eagle3StepMetrics&) = delete;
  Eagle3StepMetrics& operator=(const Eagle3StepMetrics&) = delete;

  void add(const model::StepOutput& out) { sums_.add(schema_.row(out)); }
  bool empty() const { return sums_.empty(); }
  std::vector<std::pair<std::string, double>> report(comm::Communicator& comm,
                                                     const std::string& prefix,
                                                     int64_t* global_tokens = nullptr) {
    return sums_.report(comm, prefix, global_tokens);
  }
  std::vector<double> global_sums(comm::Communicator& comm) const {
    return sums_.global_sums(comm);
  }
  void add_sums(const std::vector<double>& sums) { sums_.add_sums(sums); }

 private:
  algo::Eagle3Metrics schema_;
  train::StepMetrics sums_;
};

}  // namespace fsdp::test
