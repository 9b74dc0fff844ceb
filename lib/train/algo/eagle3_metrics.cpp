// EAGLE3's metric sums (train/algo/eagle3_metrics.h).
#include "train/algo/eagle3_metrics.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "model/ttt_loss.h"

namespace fsdp::algo {
namespace {

// Offsets into the sums (see Eagle3Metrics' layout).
struct Layout {
  int64_t T;
  int64_t ploss() const { return 0; }
  int64_t correct() const { return T; }
  int64_t loss_tokens() const { return 2 * T; }
  int64_t valid() const { return 3 * T; }
  int64_t micro() const { return 3 * T + 1; }
  int64_t accepted() const { return 3 * T + 2; }
  int64_t anchors() const { return 3 * T + 3; }
  int64_t chain_hits() const { return 3 * T + 4; }
  int64_t draft_accepted() const { return 4 * T + 4; }
  int64_t drafts() const { return 4 * T + 5; }
  int64_t accept_rate_renorm() const { return 4 * T + 6; }
  int64_t position() const { return 5 * T + 6; }
  int64_t batch_acc() const { return 6 * T + 6; }
  int64_t objective() const { return 7 * T + 6; }
  int64_t objective_units() const { return 7 * T + 7; }
  int64_t accept_rate() const { return 7 * T + 8; }
  int64_t accept_position() const { return 8 * T + 8; }
  int64_t size() const { return 9 * T + 8; }
};

}  // namespace

int64_t Eagle3Metrics::width() const {
  return Layout{ttt_}.size();
}
int64_t Eagle3Metrics::units_index() const {
  return Layout{ttt_}.micro();
}
int64_t Eagle3Metrics::valid_tokens_index() const {
  return Layout{ttt_}.valid();
}

at::Tensor Eagle3Metrics::row(const model::StepOutput& out) const {
  auto as64 = [](const at::Tensor& t) { return t.detach().to(at::kDouble).reshape({-1}); };
  const at::Tensor correct = as64(out.correct), loss_tokens = as64(out.loss_tokens);
  // A packed micro-batch stands for its documents: ploss and batch_acc are sums over them.
  const at::Tensor units = at::full({1}, static_cast<double>(out.units), correct.options());
  const at::Tensor batch_acc =
      out.batch_acc.defined() ? as64(out.batch_acc) : correct / loss_tokens.clamp_min(1e-6);
  const at::Tensor positions = as64(out.position_tokens);
  return at::cat({as64(out.ploss), correct, loss_tokens, as64(out.valid_tokens), units,
                  as64(out.accepted), as64(out.anchors), as64(out.chain_hits),
                  as64(out.draft_accepted), as64(out.drafts), as64(out.accept_rate_renorm),
                  positions, batch_acc, as64(out.objective), units, as64(out.accept_rate),
                  positions});
}

std::vector<double> Eagle3Metrics::adopt(const std::vector<double>& saved) const {
  const int64_t T = ttt_;
  const Layout L{T};
  const auto n = static_cast<int64_t>(saved.size());
  if ((n != 3 * T + 2 && n != 3 * T + 4 && n != 7 * T + 6 && n != L.size()) ||
      saved[static_cast<size_t>(L.micro())] <= 0)
    return {};
  std::vector<double> padded(saved);
  padded.resize(static_cast<size_t>(L.size()), 0.0);
  return padded;
}

std::vector<std::pair<std::string, double>> Eagle3Metrics::report(const double* v,
                                                                  const std::string& prefix) const {
  const int64_t T = ttt_;
  const Layout L{T};
  const double micro = v[L.micro()];
  const auto step = [&](const char* name, int64_t i) {
    return prefix + "/" + name + "_" + std::to_string(i);
  };
  std::vector<std::pair<std::string, double>> out;
  for (int64_t i = 0; i < T; ++i)
    out.emplace_back(step("ploss", i), micro > 0 ? v[L.ploss() + i] / micro : std::nan(""));
  // acc_i pooled (sum correct / sum tokens) or the mean of the micro-batches' own acc_i.
  std::vector<double> acc(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    acc[static_cast<size_t>(i)] = aggregation_ == config::AccuracyAggregation::kPerBatch
                                      ? (micro > 0 ? v[L.batch_acc() + i] / micro : 0.0)
                                      : v[L.correct() + i] / std::max(v[L.loss_tokens() + i], 1e-6);
    out.emplace_back(step("acc", i), acc[static_cast<size_t>(i)]);
  }
  // The objective the micro-batches backpropagated (model::StepOutput::objective), per sample.
  const double units = v[L.objective_units()];
  out.emplace_back(prefix + "/loss", units > 0 ? v[L.objective()] / units : std::nan(""));
  // Absent when no reply had a drafted token / no sample had T consecutive loss positions.
  if (v[L.drafts()] > 0)
    out.emplace_back(prefix + "/accept_len", 1.0 + v[L.draft_accepted()] / v[L.drafts()]);
  if (v[L.anchors()] > 0) {
    out.emplace_back(prefix + "/accept_len_all_anchors", 1.0 + v[L.accepted()] / v[L.anchors()]);
  }
  double simulated = 0.0, chain = 1.0;
  for (double a : acc) simulated += (chain *= a);
  out.emplace_back(prefix + "/simulated_acc_len", simulated);
  for (int64_t i = 0; i < T; ++i) {
    out.emplace_back(step("acceptance_rate", i),
                     v[L.accept_rate() + i] / std::max(v[L.accept_position() + i], 1e-6));
  }
  for (int64_t i = 0; i < T; ++i) {
    out.emplace_back(step("acceptance_rate_renorm", i),
                     v[L.accept_rate_renorm() + i] / std::max(v[L.position() + i], 1e-6));
  }
  for (int64_t i = 0; i < T; ++i) {
    const double before = i == 0 ? v[L.anchors()] : v[L.chain_hits() + i - 1];
    if (before > 0) out.emplace_back(step("cond_acc", i), v[L.chain_hits() + i] / before);
  }
  return out;
}

}  // namespace fsdp::algo
