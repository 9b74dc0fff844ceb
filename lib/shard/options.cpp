// Strategy names, option validation and the default communicator groups (see options.h).
// Must never create communicators anywhere but make_comm_groups.
#include "shard/options.h"

#include <algorithm>
#include <cctype>

#include "comm/runtime.h"
#include "core/dtype.h"
#include "core/error.h"

namespace fsdp::shard {

Strategy parse_strategy(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "full_shard") return Strategy::kFullShard;
  if (n == "shard_grad_op") return Strategy::kShardGradOp;
  if (n == "no_shard") return Strategy::kNoShard;
  if (n == "hybrid_shard") return Strategy::kHybridShard;
  throw_usage_error(__FILE__, __LINE__, str("unknown sharding strategy '", name, "'"),
                    "use one of full_shard, shard_grad_op, no_shard, hybrid_shard");
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kFullShard:
      return "full_shard";
    case Strategy::kShardGradOp:
      return "shard_grad_op";
    case Strategy::kNoShard:
      return "no_shard";
    case Strategy::kHybridShard:
      return "hybrid_shard";
  }
  return "?";
}

void EngineOptions::validate() const {
  const auto pd = mixed_precision.param_dtype;
  const auto rd = mixed_precision.reduce_dtype;
  FSDP_USAGE_CHECK(pd == c10::kFloat || pd == c10::kBFloat16,
                   str("parameter dtype ", dtype_name(pd), " is not supported"),
                   "use --mixed-precision bf16 or fp32");
  FSDP_USAGE_CHECK(rd == c10::kFloat || rd == c10::kBFloat16,
                   str("reduce dtype ", dtype_name(rd), " is not supported"),
                   "use --reduce-dtype fp32 or bf16");
  FSDP_USAGE_CHECK(device.is_cpu() || device.is_cuda(),
                   str("device ", device.str(), " is not supported by the sharding engine"),
                   "use a CPU or CUDA device");
  std::vector<std::string> sorted = units;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  FSDP_USAGE_CHECK(dup == sorted.end(), str("unit '", *dup, "' is listed twice"),
                   "list each unit once");
  adamw.validate();
  if (muon) {
    muon_options.validate();
    FSDP_USAGE_CHECK(muon_lr_ratio > 0, str("--muon-lr-ratio ", muon_lr_ratio),
                     "give a positive ratio of Muon's learning rate to the base one, e.g. 10");
    FSDP_USAGE_CHECK(step_scalars != StepScalars::kDevice,
                     "--step-scalars device with --optimizer muon: Muon's step is driven from "
                     "the host",
                     "use --step-scalars auto (or host) with --optimizer muon");
  }
}

CommGroups make_comm_groups(Strategy strategy, const c10::Device& device) {
  using comm::Group;
  switch (strategy) {
    case Strategy::kFullShard:
    case Strategy::kShardGradOp:
      return {comm::make_communicator(Group::kWorld, device), nullptr};
    case Strategy::kNoShard:
      return {nullptr, comm::make_communicator(Group::kWorld, device)};
    case Strategy::kHybridShard:
      return {comm::make_communicator(Group::kNode, device),
              comm::make_communicator(Group::kCrossNode, device)};
  }
  assert_fail(__FILE__, __LINE__, "strategy", "unknown sharding strategy");
}

}  // namespace fsdp::shard
