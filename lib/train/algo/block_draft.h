// What the block-draft families (DFlash, DSpark; docs/block-drafts.md) share behind the
// algorithm seam: the draft config with the run's overrides, the options a block draft refuses,
// the export's config.json, the feature files they read, the backbone's architecture check on
// resume, the blocks of a micro-batch, the backbone's model FLOPs and the loading of an initial
// export. Each family's Algorithm (train/algo/dflash.h, dspark.h) calls these; neither branches
// on the other.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "config/train_config.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "model/dflash_config.h"
#include "model/dflash_model.h"
#include "train/algo/algorithm.h"

namespace torch::nn {
class Module;
}
namespace fsdp::shard {
class ShardEngine;
}

namespace fsdp::algo::block {

// --draft-model-config with the run's overrides applied (SpecForge lets a run override
// block_size; the mask token is the run's --mask-token-id, else the config's).
model::DFlashConfig load_config(const config::TrainConfig& cfg);

// UsageError naming the option for what a block draft cannot honour: the EAGLE3-only options
// and `other_options` (those of the other block family, `other_family`) when given, sequence
// parallelism, packing, LoRA; and a draft config without a mask token. Families are named as
// the messages say them: "a DFlash", "a DSpark".
void check_supported(const config::TrainConfig& cfg, const model::DFlashConfig& draft,
                     const std::string& family, const std::string& other_family,
                     const std::vector<std::string>& other_options);

// The export's config.json (checkpoint/block_draft_contract.h) for the target of the run: made
// before training, so that a draft the engines cannot serve as trained stops first.
std::string export_config(const config::TrainConfig& cfg, const model::DFlashConfig& draft);

// The export of a block draft: `config_json` (export_config's) and the weights in
// --export-dtype, under the module's (SpecForge's) names.
checkpoint::CheckpointExport checkpoint_export(const config::TrainConfig& cfg,
                                               const std::string& config_json);

// The dataset options of a block draft: len(target_layer_ids) captured layers, which a dump that
// records its layers (DeepSpec) must equal; SpecForge's .ckpt keys (input_ids, loss_mask,
// hidden_states: the target layers concatenated; target_last_hidden_states), the other formats
// under their own names; the target's last hidden state required when `needs_last_hidden`,
// else never read.
data::DatasetOptions dataset_options(const model::DFlashConfig& draft, bool needs_last_hidden);

// UsageError unless the dataset's format carries a block draft's features (SpecForge .ckpt /
// .ckpt.gz, speculators, ModelOpt, DeepSpec, native shards); `keys` names the tensors the
// family reads, for the message.
void check_dataset(const data::FeatureDataset& ds, const std::string& flag,
                   const std::string& family, const std::string& keys);

// The sizes of the saved backbone that differ from `now` ("hidden_size 64 vs 128, ..."); empty
// when none does.
std::string backbone_difference(const model::DFlashConfig& saved, const model::DFlashConfig& now);

// The blocks of a training or evaluation micro-batch: anchors drawn per sample from the run's
// seed, the epoch and the sample's index (model/block_targets.h), so any rank count, micro-batch
// size or resume draws the same.
model::BlockLayout sample_layout(const config::TrainConfig& cfg, const data::Batch& b,
                                 int64_t block_size, const c10::Device& device);

// The target's embedding and LM head, shared with the draft and frozen: read from
// --target-model-path, on the device in the run's compute dtype.
struct FrozenTarget {
  at::Tensor embedding, lm_head;
};
FrozenTarget frozen_target(const config::TrainConfig& cfg, const model::DFlashConfig& draft,
                           const c10::Device& device);

// The sharding engine over `module` (already on the device) with the run's engine options and
// the module's `units`; the module's unit hooks are the caller's to set.
std::unique_ptr<shard::ShardEngine> make_engine(const config::TrainConfig& cfg,
                                                torch::nn::Module& module,
                                                std::vector<std::string> units,
                                                const c10::Device& device);

// A micro-batch in blocks: the sampled layout, the ids and loss mask on the device, and the
// block tokens' embeddings ([anchor, mask, ...] through the target's embedding).
struct BlockInputs {
  model::BlockLayout layout;
  at::Tensor ids, loss_mask, embedded;
};
BlockInputs block_inputs(const config::TrainConfig& cfg, const data::Batch& b, int64_t block_size,
                         const at::Tensor& embedding, int64_t mask_token,
                         const c10::Device& device);

// A micro-batch's result: `loss_sum` (what backward runs), the metric row `sums`, and while
// training the normaliser `den` the step divides by and the backbone's FLOPs for B rows of S
// positions in N blocks.
MicroBatchResult micro_batch_result(const at::Tensor& loss_sum, const at::Tensor& den,
                                    const at::Tensor& sums, bool training,
                                    const model::DFlashConfig& draft, int64_t B, int64_t S,
                                    int64_t N);

// Model FLOPs of one training micro-batch through the backbone and the frozen LM head (forward
// + backward: 3x the forward's matmuls, the LM head 2x): fc over the context, per layer the
// projections and MLP of the block tokens, the keys/values of the context, and attention over
// [context | own block]. B rows of S context positions, N blocks each, vocabulary V.
double backbone_step_flops(const model::DFlashConfig& c, int64_t B, int64_t S, int64_t N,
                           int64_t V);

// Loads --init-checkpoint's tensors into `module` through the engine: every parameter of the
// module must be in the export and finite (UsageError naming the tensor); `family` for the hint.
void load_init_weights(torch::nn::Module& module, shard::ShardEngine& engine,
                       const checkpoint::DraftExport& init, const std::string& init_path,
                       const std::string& family);

}  // namespace fsdp::algo::block
