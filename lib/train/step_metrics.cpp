// Exact cross-rank metric reduction (train/step_metrics.h).
#include "train/step_metrics.h"

#include <ATen/ATen.h>

#include "comm/communicator.h"

namespace fsdp::train {

void StepMetrics::accumulate(const at::Tensor& row, int64_t micro_batches) {
  if (micro_batches_ == 0) {
    sums_ = row.clone();  // own storage: the same row is added to several accumulators
  } else {
    sums_.add_(row);
  }
  micro_batches_ += micro_batches;
}

void StepMetrics::add(const at::Tensor& sums) {
  accumulate(sums.detach().to(at::kDouble), 1);
}

void StepMetrics::clear() {
  micro_batches_ = 0;
  sums_ = at::Tensor();
}

at::Tensor StepMetrics::reduced(comm::Communicator& comm) const {
  // One buffer, one all-reduce; the communicator's device decides where the reduction runs.
  at::Tensor buf =
      micro_batches_ > 0
          ? sums_.clone()
          : at::zeros({schema_->width()}, at::TensorOptions().dtype(at::kDouble).device(device_));
  buf = buf.contiguous();
  comm.all_reduce(buf, comm::ReduceOp::kSum)->wait();
  return buf.to(at::kCPU);
}

std::vector<double> StepMetrics::global_sums(comm::Communicator& comm) const {
  const at::Tensor host = reduced(comm);
  const double* v = host.data_ptr<double>();
  return std::vector<double>(v, v + host.numel());
}

void StepMetrics::add_sums(const std::vector<double>& sums) {
  const std::vector<double> adopted = schema_->adopt(sums);
  if (adopted.empty()) return;
  const at::Tensor all = at::tensor(adopted, at::TensorOptions().dtype(at::kDouble))
                             .to(sums_.defined() ? sums_.device() : device_);
  accumulate(all, static_cast<int64_t>(adopted[static_cast<size_t>(schema_->units_index())]));
}

std::vector<std::pair<std::string, double>> StepMetrics::report(comm::Communicator& comm,
                                                                const std::string& prefix,
                                                                int64_t* global_tokens) {
  const at::Tensor host = reduced(comm);
  const double* v = host.data_ptr<double>();
  auto out = schema_->report(v, prefix);
  if (global_tokens) *global_tokens = static_cast<int64_t>(v[schema_->valid_tokens_index()]);
  clear();
  return out;
}

}  // namespace fsdp::train
