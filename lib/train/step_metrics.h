// Metric accumulation between log points: a micro-batch's metric sums (its algorithm's
// MetricSchema, train/algo/algorithm.h) added across micro-batches and reduced exactly over all
// ranks (numerators and denominators all-reduced, not averages of averages) into named scalars.
// Keeps tensors on the device until report() so the step itself never synchronises the host.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/algo/algorithm.h"

namespace fsdp::comm {
class Communicator;
}

namespace fsdp::train {

class StepMetrics {
 public:
  // `schema` outlives this object. `device`: where report()'s buffer lives when nothing was
  // added (the metrics communicator's device: NCCL reduces device tensors only).
  explicit StepMetrics(const algo::MetricSchema& schema,
                       c10::Device device = c10::Device(c10::kCPU))
      : schema_(&schema), device_(device) {}
  // A micro-batch's sums (float64 [schema.width()], algo::MicroBatchResult::sums).
  void add(const at::Tensor& sums);
  bool empty() const { return micro_batches_ == 0; }
  // All-reduces the sums over `comm` (every rank must call) and returns the schema's metrics
  // (docs/reference.md §5) and the global number of valid tokens; then clears the sums.
  std::vector<std::pair<std::string, double>> report(comm::Communicator& comm,
                                                     const std::string& prefix,
                                                     int64_t* global_tokens = nullptr);
  void clear();
  // The sums of every rank so far, all-reduced (every rank must call; nothing is cleared): what
  // a checkpoint records so that the epoch's metrics stay exact across a resume.
  std::vector<double> global_sums(comm::Communicator& comm) const;
  // Adds such sums (a resumed checkpoint's) to this rank's: call on one rank only, since
  // report() adds up the ranks. Ignored when the schema cannot adopt them (another layout).
  void add_sums(const std::vector<double>& sums);

 private:
  at::Tensor reduced(comm::Communicator& comm) const;  // the all-reduced buffer, on the host
  void accumulate(const at::Tensor& row, int64_t micro_batches);
  const algo::MetricSchema* schema_;
  c10::Device device_;
  int64_t micro_batches_ = 0;
  at::Tensor sums_;
};

}  // namespace fsdp::train
