// `fsdp-train memory-plan`: the start-up memory estimate (model/memory_estimate.h) for a draft
// config over sample lengths and sequence-parallel sizes, without data or a device: what each
// rank needs, the longest sample each size fits, and the smallest size that fits each length
// (docs/benchmarks.md "Memory model for long samples").
#include <CLI/CLI.hpp>

#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "model/draft_config.h"
#include "model/memory_estimate.h"

namespace fsdp::app {
namespace {

struct MemoryPlanArgs {
  std::string draft_config;
  std::vector<int64_t> lengths{2048, 8192, 16384, 32768, 65536, 131072};
  std::vector<int64_t> sp_sizes{1, 2, 4, 8};
  double device_gib = 139.8;  // an H200's 143,771 MiB as its driver reports them
  double overhead_gib = 0.0;  // measured peak minus estimate at a known point (calibration)
  std::string precision = "bf16";
  bool activation_checkpointing = false;
  int64_t head_chunk_rows = 0;
  int64_t ttt_length = 7;
  int64_t dp = 1;
};

long double estimate(const model::DraftConfig& cfg, const MemoryPlanArgs& a, int64_t S,
                     int64_t sp) {
  model::MemoryPlan p;
  p.max_length = S;
  p.micro_batch = 1;
  p.ttt_length = a.ttt_length;
  p.activation_checkpointing = a.activation_checkpointing;
  p.head_chunk_rows = a.head_chunk_rows;
  p.compute_bytes = a.precision == "fp32" ? 4 : 2;
  p.shard_ranks = sp * a.dp;  // full_shard over every rank of the job
  p.seq_parallel = sp;
  return model::estimate_training_memory(cfg, p).total() +
         static_cast<long double>(a.overhead_gib) * (1024.0L * 1024 * 1024);
}

std::string gib(long double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << static_cast<double>(bytes / (1024.0L * 1024 * 1024));
  return s.str();
}

int run(const MemoryPlanArgs& a) {
  FSDP_USAGE_CHECK(a.precision == "bf16" || a.precision == "fp32",
                   str("memory-plan: --mixed-precision '", a.precision, "' is not bf16 or fp32"),
                   "give bf16 (the default) or fp32");
  FSDP_USAGE_CHECK(a.device_gib > 0 && a.dp >= 1 && a.ttt_length >= 1,
                   "memory-plan: --device-memory-gib, --dp and --ttt-length must be positive",
                   "give positive values");
  for (const int64_t x : a.lengths)
    FSDP_USAGE_CHECK(x >= 1, str("memory-plan: length ", x, " is not positive"),
                     "give lengths of 1 token or more");
  for (const int64_t x : a.sp_sizes)
    FSDP_USAGE_CHECK(x >= 1, str("memory-plan: sequence-parallel size ", x, " is not positive"),
                     "give sizes of 1 or more");
  const model::DraftConfig cfg = model::load_draft_config(a.draft_config);
  const long double device = static_cast<long double>(a.device_gib) * 1024.0L * 1024 * 1024;
  std::cout << "memory-plan: " << a.draft_config << ", " << a.precision << ", T " << a.ttt_length
            << ", micro-batch 1, activation checkpointing "
            << (a.activation_checkpointing ? "on" : "off") << ", --head-chunk-rows "
            << a.head_chunk_rows << ", full_shard over " << a.dp
            << " x SP ranks; estimate per rank + " << a.overhead_gib << " GiB overhead, against "
            << a.device_gib << " GiB per device\n\n";
  std::cout << "| S |";
  for (const int64_t sp : a.sp_sizes) std::cout << " SP " << sp << " (GiB) |";
  std::cout << " smallest SP that fits |\n|---|";
  for (size_t i = 0; i <= a.sp_sizes.size(); ++i) std::cout << "---|";
  std::cout << "\n";
  for (const int64_t S : a.lengths) {
    std::cout << "| " << S << " |";
    int64_t smallest = 0;
    for (const int64_t sp : a.sp_sizes) {
      const long double e = estimate(cfg, a, S, sp);
      const bool fits = e <= device;
      if (fits && (smallest == 0 || sp < smallest)) smallest = sp;
      std::cout << " " << gib(e) << (fits ? "" : " (no)") << " |";
    }
    std::cout << " " << (smallest ? std::to_string(smallest) : std::string("none listed"))
              << " |\n";
  }
  // The longest sample each size fits (to 1,024 tokens), by bisection on the monotone estimate.
  std::cout << "\nlongest sample that fits one rank's " << a.device_gib << " GiB:\n";
  for (const int64_t sp : a.sp_sizes) {
    int64_t lo = 0, hi = int64_t{1} << 24;  // in units of 1,024 tokens
    if (estimate(cfg, a, 1024, sp) > device) {
      std::cout << "  SP " << sp << ": none (1,024 tokens need " << gib(estimate(cfg, a, 1024, sp))
                << " GiB)\n";
      continue;
    }
    lo = 1;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      (estimate(cfg, a, mid * 1024, sp) <= device ? lo : hi) = mid;
    }
    std::cout << "  SP " << sp << ": " << lo * 1024 << " tokens\n";
  }
  return 0;
}

}  // namespace

void add_memory_plan(CLI::App& root, Action* action) {
  auto a = std::make_shared<MemoryPlanArgs>();
  CLI::App* sub = root.add_subcommand(
      "memory-plan",
      "the start-up memory estimate per rank for a draft config over sample lengths and "
      "sequence-parallel sizes: what fits a device, the longest sample per size, the smallest "
      "--sp-ulysses-size per length (no data, no device needed)");
  sub->add_option("--draft-model-config", a->draft_config, "draft config.json")->required();
  sub->add_option("--max-length", a->lengths, "sample lengths in tokens, comma-separated")
      ->delimiter(',');
  sub->add_option("--sp-sizes", a->sp_sizes, "sequence-parallel sizes, comma-separated")
      ->delimiter(',');
  sub->add_option("--device-memory-gib", a->device_gib,
                  "memory of one device in GiB (default 139.8: an H200)");
  sub->add_option("--overhead-gib", a->overhead_gib,
                  "added to every estimate: a device's measured peak minus the estimate at a "
                  "known point (the CUDA context and allocator slack; default 0)");
  sub->add_option("--mixed-precision", a->precision, "bf16 (default) or fp32");
  sub->add_flag("--activation-checkpointing", a->activation_checkpointing, "as the training flag");
  sub->add_option("--head-chunk-rows", a->head_chunk_rows,
                  "as the training flag (0: automatic, -1: unchunked)");
  sub->add_option("--ttt-length", a->ttt_length, "TTT steps (default 7)");
  sub->add_option("--dp", a->dp,
                  "data-parallel size: the state is sharded over dp x SP ranks (default 1)");
  sub->callback([action, a]() {
    action->run = [a]() { return run(*a); };
    action->needs_mpi = false;
  });
}

}  // namespace fsdp::app
