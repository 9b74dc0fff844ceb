// The loaders of a run's feature sets (train/feature_loader.h).
#include "train/feature_loader.h"

#include <algorithm>

#include "data/sampler.h"
#include "train/component_options.h"

namespace fsdp::train {

std::unique_ptr<data::DataLoader> make_feature_loader(const config::TrainConfig& cfg,
                                                      const RunTopology& topo,
                                                      const config::BatchPlan& plan,
                                                      std::shared_ptr<data::FeatureDataset> ds,
                                                      data::SampleLayout layout, bool training) {
  data::DistributedSampler sampler(ds->size(), topo.dp_rank(), topo.dp_world(), plan.micro_batch,
                                   static_cast<uint64_t>(cfg.loop.seed), /*shuffle=*/training);
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
  lo.validate();
  return std::make_unique<data::DataLoader>(ds, sampler, lo);
}

}  // namespace fsdp::train
