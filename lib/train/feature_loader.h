// The loaders of a run's feature sets: the sampler over this rank's data-parallel share and the
// loader's options (noise for training only, the sequence-parallel slice, read-ahead for
// packing). Used by the training loop and the evaluator alike.
#pragma once

#include <memory>

#include "config/train_config.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/run_topology.h"

namespace fsdp::train {

// `layout`: the algorithm's (Algorithm::sample_layout). `training`: shuffled, with the aux noise of
// --noise-std and packing's read-ahead; otherwise dataset order without noise. `plan`: micro-batch
// and accumulation.
std::unique_ptr<data::DataLoader> make_feature_loader(const config::TrainConfig& cfg,
                                                      const RunTopology& topo,
                                                      const config::BatchPlan& plan,
                                                      std::shared_ptr<data::FeatureDataset> ds,
                                                      data::SampleLayout layout, bool training);

// The training loader of a stream (data/spool.h, `ds` a SpoolDataset): positions in arrival
// order (no shuffle), the training loader's noise and read-ahead, bad samples skipped and counted
// (a producer's truncated file never stops the run), and the stream's end marked on the micro-batch
// before it (Batch::ends_stream).
std::unique_ptr<data::DataLoader> make_stream_loader(const config::TrainConfig& cfg,
                                                     const RunTopology& topo,
                                                     const config::BatchPlan& plan,
                                                     std::shared_ptr<data::FeatureDataset> ds,
                                                     data::SampleLayout layout);

}  // namespace fsdp::train
