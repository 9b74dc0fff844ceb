// The loaders of a run's feature sets (train/feature_loader.h).
#include "train/feature_loader.h"

#include <algorithm>

#include "data/sampler.h"
#include "train/component_options.h"

namespace fsdp::train {

namespace {

data::LoaderOptions options_for(const config::TrainConfig& cfg, const RunTopology& topo,
                                const config::BatchPlan& plan, data::SampleLayout layout,
                                bool training) {
  data::LoaderOptions lo = loader_options(cfg, topo.device());
  lo.layout = layout;
  if (training) lo.noise = noise_options(cfg);
  // Sequence parallelism: the group's ranks read the same samples, each keeping its slice.
  lo.sp_rank = topo.sp_rank();
  lo.sp_size = topo.sp();
  lo.sp_halo = cfg.model.ttt_length - 1;
  // Packing trains a whole accumulation window at once: read one window ahead.
  if (training && cfg.loop.packing)
    lo.prefetch_depth =
        static_cast<int>(std::clamp<int64_t>(plan.accumulation_steps, lo.prefetch_depth, 1024));
  return lo;
}

}  // namespace

std::unique_ptr<data::DataLoader> make_feature_loader(const config::TrainConfig& cfg,
                                                      const RunTopology& topo,
                                                      const config::BatchPlan& plan,
                                                      std::shared_ptr<data::FeatureDataset> ds,
                                                      data::SampleLayout layout, bool training) {
  data::DistributedSampler sampler(ds->size(), topo.dp_rank(), topo.dp_world(), plan.micro_batch,
                                   static_cast<uint64_t>(cfg.loop.seed), /*shuffle=*/training);
  data::LoaderOptions lo = options_for(cfg, topo, plan, layout, training);
  lo.validate();
  return std::make_unique<data::DataLoader>(ds, sampler, lo);
}

std::unique_ptr<data::DataLoader> make_stream_loader(const config::TrainConfig& cfg,
                                                     const RunTopology& topo,
                                                     const config::BatchPlan& plan,
                                                     std::shared_ptr<data::FeatureDataset> ds,
                                                     data::SampleLayout layout) {
  // Position p of the stream is the sampler's index p: rank r's micro-batch b holds positions
  // (b * B + j) * W + r, as an unshuffled DistributedSampler orders a dataset.
  data::DistributedSampler sampler(ds->size(), topo.dp_rank(), topo.dp_world(), plan.micro_batch,
                                   static_cast<uint64_t>(cfg.loop.seed), /*shuffle=*/false);
  data::LoaderOptions lo = options_for(cfg, topo, plan, layout, /*training=*/true);
  lo.stream = true;
  lo.accumulation = plan.accumulation_steps;
  lo.skip_bad_samples = true;
  lo.prefetch_depth = std::max(lo.prefetch_depth, 2);
  lo.validate();
  return std::make_unique<data::DataLoader>(ds, sampler, lo);
}

}  // namespace fsdp::train
