// The evaluation of the current weights (train/evaluator.h).
#include "train/evaluator.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/log.h"
#include "data/batch.h"
#include "data/loss_mask_stats.h"
#include "data/sampler.h"
#include "train/feature_loader.h"
#include "train/step_metrics.h"
#include "train/step_runner.h"

namespace fsdp::train {

Evaluator::Evaluator(const config::TrainConfig& cfg, const RunTopology& topo,
                     const config::BatchPlan& plan, algo::Algorithm& algorithm,
                     std::shared_ptr<data::FeatureDataset> set)
    : cfg_(cfg), topo_(topo), plan_(plan), algorithm_(algorithm), set_(std::move(set)) {}

void Evaluator::check_size() const {
  const data::FeatureDataset& ds = *set_;
  const int dp_world = topo_.dp_world();
  FSDP_USAGE_CHECK(ds.size() >= static_cast<int64_t>(dp_world) * plan_.micro_batch,
                   fsdp::str("evaluation data (", ds.root(), ") has ", ds.size(),
                             " samples: ", "fewer than one micro-batch per rank (", dp_world,
                             " rank(s) x ", plan_.micro_batch, ")"),
                   "use more evaluation samples, fewer ranks or a smaller "
                   "--draft-micro-batch-size");
}

void Evaluator::warn_left_out() const {
  // Evaluation splits the set like training: whole micro-batches per rank (docs/data.md).
  const int64_t n = set_->size();
  const int dp_world = topo_.dp_world();
  const int64_t used =
      data::DistributedSampler(n, topo_.dp_rank(), dp_world, plan_.micro_batch, 0, false)
          .batches_per_epoch() *
      plan_.micro_batch * dp_world;
  if (used < n) {
    FSDP_LOG0(kWarn) << "--eval-hidden-states-path: each evaluation uses " << used << " of the "
                     << n
                     << " samples (whole micro-batches on every data-parallel rank: " << dp_world
                     << " x micro-batch " << plan_.micro_batch << "): " << n - used
                     << " sample(s) at its end are left out (a set size divisible by "
                     << dp_world * plan_.micro_batch << " evaluates all)";
  }
}

std::vector<std::pair<std::string, double>> Evaluator::evaluate(
    const std::string& prefix, const std::function<void()>& before_failure) {
  check_size();
  auto loader = make_feature_loader(cfg_, topo_, plan_, set_, algorithm_.sample_layout(),
                                    /*training=*/false);
  loader->start({0, 0});
  StepMetrics m(algorithm_.metrics(), topo_.metrics_device());
  at::NoGradGuard no_grad;
  int64_t zero_loss = 0, loss_tokens = 0;  // this rank's (samples without a loss token)
  const ReadAgreement agreement{topo_.world(), [this](bool mine) { return topo_.any_rank(mine); }};
  while (true) {
    auto b = read_agreed([&] { return loader->next(); }, agreement, "evaluation data loading",
                         [&](ReadFailure) {
                           if (before_failure) before_failure();
                         });
    if (!b) break;
    *b = topo_.share(std::move(*b), cfg_.model.ttt_length - 1);
    zero_loss += data::zero_loss_rows(*b);
    loss_tokens += b->num_loss_tokens();
    m.add(algorithm_.forward(*b, /*training=*/false).sums);
  }
  auto r = m.report(topo_.metrics(), prefix);
  at::Tensor counts = at::tensor({zero_loss, loss_tokens}, at::kLong);
  topo_.reduce_counts(counts, comm::ReduceOp::kSum);
  r.emplace_back(prefix + "/zero_loss_samples", static_cast<double>(counts[0].item<int64_t>()));
  if (counts[1].item<int64_t>() == 0) {
    FSDP_LOG0(kWarn) << prefix << ": the evaluation set had no loss tokens at all (every loss "
                     << "mask all-zero): its metrics mean nothing (docs/data.md 'Loss masks')";
  }
  if (topo_.is_root() && !loader->bad_sample_summary().empty()) {
    FSDP_LOG0(kWarn) << loader->bad_sample_summary();
  }
  return r;
}

}  // namespace fsdp::train
