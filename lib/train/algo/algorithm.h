// The algorithm seam (docs/architecture.md "Draft algorithms"): everything that differs between
// draft families lives behind this one interface, chosen once at start-up from the draft
// config's architecture (algo/registry.h); the trainer never branches on the family again.
// What stays shared and outside: the sharding engine, the loader and every feature format,
// checkpoints and resume, trackers, the loop's cadence, the launcher.
//
// An algorithm owns: its draft config contract, the feature contract a sample must meet, the
// model (a torch module the engine shards, in units it names) with the frozen target tensors it
// reads, the objective of one micro-batch, its metric sums and their meaning (each family's own
// engine-faithful simulated acceptance), and the export each engine serves. It keeps no state
// of its own across steps: whatever it draws at random is keyed by the run's seed and the
// batch's samples (data::Batch::epoch, sample_indices), so a resume on any number of ranks
// draws the same; the engine and the loop save everything else.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/export.h"
#include "config/train_config.h"
#include "data/batch.h"
#include "data/dataset.h"

namespace torch::nn {
class Module;
}
namespace fsdp::comm {
class Communicator;
}
namespace fsdp::model {
class SeqGroup;
struct MemoryPlan;
}  // namespace fsdp::model
namespace fsdp::shard {
class ShardEngine;
}

namespace fsdp::algo {

// What the trainer hands an algorithm: the run's settings and the parts of its topology an
// algorithm may use. Pointers stay valid for the algorithm's life.
struct Context {
  const config::TrainConfig* cfg = nullptr;
  c10::Device device{c10::kCPU};
  bool is_root = true;
  comm::Communicator* control = nullptr;  // CPU, every rank (e.g. a vocabulary mapping's counts)
  model::SeqGroup* seq_group = nullptr;   // --sp-ulysses-size > 1, else none
  // Micro-batches per optimizer step that a training micro-batch's loss is divided by (packed:
  // the samples of the step, each weighing as a micro-batch of one).
  int64_t accumulation = 1;
};

// Where the model's weights come from besides its initialisation: the export of
// --init-checkpoint, and the newest resume candidate (whose vocabulary mapping the model must
// be built with before the engine loads it).
struct WeightSources {
  const checkpoint::DraftExport* init = nullptr;  // none without --init-checkpoint
  std::string resume_dir;                         // empty when not resuming
};

// How a micro-batch's metric sums are read (one per algorithm). Sums are float64 vectors of
// width() added over micro-batches and all-reduced over ranks (train/step_metrics.h), so every
// reported ratio is exact across ranks, micro-batches and resumes.
class MetricSchema {
 public:
  virtual ~MetricSchema() = default;
  virtual int64_t width() const = 0;
  // Index of the micro-batch count (a packed one counting its documents) in the sums.
  virtual int64_t units_index() const = 0;
  // Index of the valid (attention) token count.
  virtual int64_t valid_tokens_index() const = 0;
  // The named metrics of all-reduced sums v (width() values), "<prefix>/<name>".
  virtual std::vector<std::pair<std::string, double>> report(const double* v,
                                                             const std::string& prefix) const = 0;
  // Sums a checkpoint recorded, brought to this width (older layouts padded as the algorithm
  // defines); empty when they cannot be used (another layout, another T).
  virtual std::vector<double> adopt(const std::vector<double>& saved) const = 0;
};

// One micro-batch through the model.
struct MicroBatchResult {
  at::Tensor loss;  // scalar, requires grad while training: what backward runs
  // Defined when `loss` (training) is a sum that the step normalises as a whole: the step's
  // gradients are divided by the sum of every micro-batch's normaliser over all data-parallel
  // ranks (as torchtitan passes its global token count), so that how the global batch is split
  // into ranks and micro-batches does not change them. Undefined: `loss` is already divided.
  at::Tensor normaliser;
  at::Tensor sums;   // float64 [schema width], detached, on the device: the metric sums
  double flops = 0;  // model FLOPs of the forward and backward (MFU accounting)
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string name() const = 0;  // "eagle3", "dflash", "dspark"

  // Start-up, in the trainer's order: settings this algorithm refuses (a named UsageError for
  // every combination it cannot honour), then the serving plan (notes logged on rank 0), then
  // the memory check.
  virtual void check_supported() const = 0;
  virtual void plan_serving() = 0;
  virtual void check_memory(const model::MemoryPlan& plan, uint64_t available,
                            const std::string& where) const = 0;

  // The data: how datasets are opened for this draft, and the checks of an opened set against
  // the draft (`flag` names the set's option in messages).
  virtual data::DatasetOptions dataset_options() const = 0;
  // How the loader lays a sample out for this draft (data/batch.h).
  virtual data::SampleLayout sample_layout() const { return data::SampleLayout::kShifted; }
  virtual void check_dataset(const data::FeatureDataset& ds, const std::string& flag) const = 0;

  // A checkpoint's config.json against this draft's: UsageError naming the keys that change
  // parameter shapes, a warning for the others. Nothing when the file does not exist.
  virtual void check_same_architecture(const std::string& saved_config,
                                       const std::string& flag) const = 0;

  // Builds the model on the context's device (identical initial weights on every rank), puts it
  // under a sharding engine and loads the initial weights. `train_ds` may be used (a vocabulary
  // mapping from the features). Collective.
  virtual void build(const WeightSources& weights, const data::FeatureDataset* train_ds) = 0;
  virtual shard::ShardEngine& engine() = 0;
  // Parameters trained and frozen, and what they are, for the start-up line.
  virtual std::string describe_parameters() const = 0;

  // One micro-batch on the device: training (the loss divided by the context's accumulation)
  // or evaluation (undivided, no gradients needed).
  virtual MicroBatchResult forward(const data::Batch& batch, bool training) = 0;
  virtual const MetricSchema& metrics() const = 0;

  // What a checkpoint exports besides the weights (the config each engine reads, mappings,
  // records), and whether the frozen base is exported too (LoRA: the merged draft).
  virtual checkpoint::CheckpointExport checkpoint_export() const = 0;
  virtual bool exports_frozen_base() const = 0;
  // A resume fell back from the newest candidate to `loaded`: UsageError unless the model
  // (built for the newest) means the same there.
  virtual void check_resume_fallback(const std::string& loaded,
                                     const std::string& newest) const = 0;
};

}  // namespace fsdp::algo
