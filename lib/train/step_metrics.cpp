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
    chains_ = at::stack({as64(out.accepted), as64(out.anchors)});
  } else {
    ploss_.add_(as64(out.ploss));
    correct_.add_(as64(out.correct));
    loss_tokens_.add_(as64(out.loss_tokens));
    valid_tokens_.add_(as64(out.valid_tokens).reshape({1}));
    chains_.add_(at::stack({as64(out.accepted), as64(out.anchors)}));
  }
  ++micro_batches_;
}

void StepMetrics::clear() {
  micro_batches_ = 0;
  ploss_ = correct_ = loss_tokens_ = valid_tokens_ = chains_ = at::Tensor();
}

at::Tensor StepMetrics::reduced(comm::Communicator& comm) const {
  const int64_t T = ttt_;
  // One buffer, one all-reduce:
  // [ploss T | correct T | loss_tokens T | valid 1 | micro 1 | accepted 1 | anchors 1].
  at::Tensor buf;
  if (micro_batches_ > 0) {
    buf = at::cat({ploss_, correct_, loss_tokens_, valid_tokens_,
                   at::full({1}, static_cast<double>(micro_batches_), ploss_.options()), chains_});
  } else {
    buf = at::zeros({3 * T + 4}, at::TensorOptions().dtype(at::kDouble).device(device_));
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
  // 3T + 2: a checkpoint written before the chain sums existed (they count as none).
  const auto n = static_cast<int64_t>(sums.size());
  if ((n != 3 * T + 2 && n != 3 * T + 4) || sums[3 * T + 1] <= 0) return;
  std::vector<double> padded(sums);
  padded.resize(3 * T + 4, 0.0);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor all = at::tensor(padded, opts).to(device_);
  const auto part = [&](int64_t from, int64_t len) { return all.narrow(0, from, len).clone(); };
  if (micro_batches_ == 0) {
    ploss_ = part(0, T);
    correct_ = part(T, T);
    loss_tokens_ = part(2 * T, T);
    valid_tokens_ = part(3 * T, 1);
    chains_ = part(3 * T + 2, 2);
  } else {
    ploss_.add_(part(0, T));
    correct_.add_(part(T, T));
    loss_tokens_.add_(part(2 * T, T));
    valid_tokens_.add_(part(3 * T, 1));
    chains_.add_(part(3 * T + 2, 2));
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
  // Absent when no sample had T consecutive loss positions (nothing to estimate from).
  if (v[3 * T + 3] > 0) out.emplace_back(prefix + "/accept_len", 1.0 + v[3 * T + 2] / v[3 * T + 3]);
  if (global_tokens) *global_tokens = static_cast<int64_t>(v[3 * T]);
  clear();
  return out;
}

}  // namespace fsdp::train
