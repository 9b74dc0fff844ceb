// The evaluation of the current weights: one pass over the evaluation set (the training set
// without one) in dataset order, each rank its whole micro-batches, through the algorithm's
// forward without gradients, its metric sums reduced over every rank (train/step_metrics.h).
// The loop asks it at --eval-interval / --eval-steps; --eval-only runs it once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"
#include "data/dataset.h"
#include "train/algo/algorithm.h"
#include "train/run_topology.h"

namespace fsdp::train {

class Evaluator {
 public:
  // All referenced objects outlive the evaluator. `set`: the evaluation set, or the training
  // set when there is none.
  Evaluator(const config::TrainConfig& cfg, const RunTopology& topo, const config::BatchPlan& plan,
            algo::Algorithm& algorithm, std::shared_ptr<data::FeatureDataset> set);

  // UsageError unless the set gives every rank at least one micro-batch.
  void check_size() const;
  // Warns (rank 0) about the samples at the set's end that no rank's whole micro-batch holds.
  void warn_left_out() const;

  // Evaluates the current weights. When reading a micro-batch fails on any rank, the ranks agree
  // on it before its collectives, run before_failure (the loop saves the last completed step
  // there), and the failing rank rethrows its error; the others stop with a usage error pointing
  // at it. Returns the algorithm's metrics under `prefix` and <prefix>/zero_loss_samples.
  std::vector<std::pair<std::string, double>> evaluate(
      const std::string& prefix, const std::function<void()>& before_failure = {});

 private:
  const config::TrainConfig& cfg_;
  const RunTopology& topo_;
  const config::BatchPlan& plan_;
  algo::Algorithm& algorithm_;
  std::shared_ptr<data::FeatureDataset> set_;
};

}  // namespace fsdp::train
