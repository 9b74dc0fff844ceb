// Exact cross-rank metric reduction (train/step_metrics.h).
#include "train/step_metrics.h"

#include <ATen/ATen.h>

#include <cmath>

#include "comm/communicator.h"
#include "model/ttt_loss.h"

namespace fsdp::train {

void StepMetrics::add(const model::StepOutput& out) {
  auto as64 = [](const at::Tensor& t) { return t.detach().to(at::kDouble); };
  if (micro_batches_ == 0) {
    ploss_ = as64(out.ploss).clone();
    correct_ = as64(out.correct).clone();
    loss_tokens_ = as64(out.loss_tokens).clone();
    valid_tokens_ = as64(out.valid_tokens).reshape({1}).clone();
  } else {
    ploss_.add_(as64(out.ploss));
    correct_.add_(as64(out.correct));
    loss_tokens_.add_(as64(out.loss_tokens));
    valid_tokens_.add_(as64(out.valid_tokens).reshape({1}));
  }
  ++micro_batches_;
}

void StepMetrics::clear() {
  micro_batches_ = 0;
  ploss_ = correct_ = loss_tokens_ = valid_tokens_ = at::Tensor();
}

at::Tensor StepMetrics::reduced(comm::Communicator& comm) const {
  const int64_t T = ttt_;
  // One buffer, one all-reduce: [ploss T | correct T | loss_tokens T | valid 1 | micro 1].
  at::Tensor buf;
  if (micro_batches_ > 0) {
    buf = at::cat({ploss_, correct_, loss_tokens_, valid_tokens_,
                   at::full({1}, static_cast<double>(micro_batches_), ploss_.options())});
  } else {
    buf = at::zeros({3 * T + 2}, at::TensorOptions().dtype(at::kDouble).device(device_));
  }
  // The communicator's device decides where the reduction runs.
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
  const int64_t T = ttt_;
  if (static_cast<int64_t>(sums.size()) != 3 * T + 2 || sums[3 * T + 1] <= 0) return;
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor all = at::tensor(sums, opts).to(device_);
  const auto part = [&](int64_t from, int64_t n) { return all.narrow(0, from, n).clone(); };
  if (micro_batches_ == 0) {
    ploss_ = part(0, T);
    correct_ = part(T, T);
    loss_tokens_ = part(2 * T, T);
    valid_tokens_ = part(3 * T, 1);
  } else {
    ploss_.add_(part(0, T));
    correct_.add_(part(T, T));
    loss_tokens_.add_(part(2 * T, T));
    valid_tokens_.add_(part(3 * T, 1));
  }
  micro_batches_ += static_cast<int64_t>(sums[3 * T + 1]);
}

std::vector<std::pair<std::string, double>> StepMetrics::report(comm::Communicator& comm,
                                                                 const std::string& prefix,
                                                                 int64_t* global_tokens) {
  const int64_t T = ttt_;
  at::Tensor host = reduced(comm);
  const double* v = host.data_ptr<double>();
  const double micro = v[3 * T + 1];
  std::vector<std::pair<std::string, double>> out;
  double loss = 0.0;
  for (int64_t i = 0; i < T; ++i) {
    const double p = micro > 0 ? v[i] / micro : std::nan("");
    loss += std::pow(0.8, static_cast<double>(i)) * p;
    out.emplace_back(prefix + "/ploss_" + std::to_string(i), p);
  }
  for (int64_t i = 0; i < T; ++i) {
    out.emplace_back(prefix + "/acc_" + std::to_string(i), v[T + i] / std::max(v[2 * T + i], 1e-6));
  }
  out.emplace_back(prefix + "/loss", loss);
  if (global_tokens) *global_tokens = static_cast<int64_t>(v[3 * T]);
  clear();
  return out;
}

}  // namespace fsdp::train
