// `fsdp-train convert`: any feature dataset -> native safetensors shards (bf16 or fp8) (lib/data
// native_convert.h). Parallel over the job's MPI ranks, resumable; never touches the input tree.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "checkpoint/export_check.h"
#include "comm/communicator.h"
#include "comm/runtime.h"
#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "data/native_convert.h"

namespace fsdp::app {

namespace {

struct ConvertFlags {
  data::ConvertOptions options;
  std::string shard_size = "1G";
  std::string target_model_path;
  bool no_check_finite = false;
};

uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string suffix = end ? end : "";
  double mult = 1;
  if (suffix == "K" || suffix == "KiB")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else
    FSDP_USAGE_CHECK(suffix.empty(), "--shard-size: cannot read '" + s + "'",
                     "write e.g. 512M or 2G");
  FSDP_USAGE_CHECK(v > 0, "--shard-size must be positive, got '" + s + "'",
                   "write e.g. 512M or 2G");
  // At most 1T (1024G): the conversion to bytes cannot overflow.
  FSDP_USAGE_CHECK(v * mult <= 1024.0 * 1024 * 1024 * 1024,
                   "--shard-size '" + s + "' is above the maximum 1024G", "write e.g. 512M or 2G");
  return static_cast<uint64_t>(v * mult);
}

int run_convert(ConvertFlags& f) {
  f.options.shard_bytes = parse_size(f.shard_size);
  f.options.dataset.check_finite = !f.no_check_finite;
  f.options.dataset.num_aux_layers = 0;  // keep every captured layer the producer wrote
  if (!f.target_model_path.empty())
    f.options.dataset.hidden_size = checkpoint::read_target_facts(f.target_model_path).hidden_size;
  auto comm = comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
  const auto rep = data::convert_to_native(f.options, comm.get());
  for (const auto& line : rep.bad_sample_lines) FSDP_LOG(kWarn) << "skipped bad sample: " << line;
  FSDP_LOG(kInfo) << "convert: " << rep.input_format
                  << (rep.input_keys.empty() ? std::string() : " (" + rep.input_keys + " keys)")
                  << " input, rank " << comm->rank() << " wrote " << rep.shards_written
                  << " shard(s) (" << rep.samples_written << " samples, "
                  << (rep.bytes_written >> 20) << " MiB), skipped " << rep.shards_skipped
                  << " already complete, in " << rep.seconds << " s";
  if (comm->rank() == 0) {
    std::cout << "convert: " << rep.shards_total << " shard(s) (" << f.options.dtype << ") in "
              << f.options.output
              << (rep.bad_samples
                      ? " (" + std::to_string(rep.bad_samples) + " bad sample(s) skipped)"
                      : "")
              << "\n";
  }
  return 0;
}

}  // namespace

void add_convert(CLI::App& root, Action* action) {
  auto f = std::make_shared<ConvertFlags>();
  CLI::App* sub = root.add_subcommand(
      "convert",
      "convert hidden states (SpecForge *.ckpt / *.ckpt.gz, speculators, ModelOpt, DeepSpec or "
      "native shards) into native memory-mapped safetensors shards, bf16 or fp8; run under "
      "mpirun to convert in parallel; rerun to resume");
  sub->add_option("--input", f->options.input,
                  "feature directory, any format fsdp-train reads (docs/data.md)")
      ->required();
  sub->add_option("--output", f->options.output,
                  "output directory for shards and features.index.json")
      ->required();
  sub->add_option("--shard-size", f->shard_size, "target shard size, e.g. 512M, 1G (default 1G)");
  sub->add_option("--dtype", f->options.dtype,
                  "hidden-state storage: bf16 (exact, default) or fp8_e4m3 (per-row scales, about "
                  "half the bytes)");
  sub->add_option("--ckpt-keys", f->options.ckpt_keys,
                  "keys of a .ckpt input: eagle3 (hidden_state, aux_hidden_state), block "
                  "(DFlash/DSpark: hidden_states, target_last_hidden_states where present) or "
                  "auto (default: from the first file's keys)");
  sub->add_option("--target-model-path", f->target_model_path,
                  "the target the features come from: its hidden size is checked against every "
                  "sample (needed for block-draft .ckpt files without target_last_hidden_states)");
  sub->add_flag("--skip-bad-samples", f->options.skip_bad_samples,
                "record bad input files in the index (training skips them) instead of stopping");
  sub->add_flag("--overwrite", f->options.overwrite, "rewrite shards even when already complete");
  sub->add_flag("--no-check-finite", f->no_check_finite, "do not scan hidden states for NaN/Inf");
  sub->callback([action, f]() {
    action->run = [f]() { return run_convert(*f); };
    action->needs_mpi = true;
  });
}

}  // namespace fsdp::app
