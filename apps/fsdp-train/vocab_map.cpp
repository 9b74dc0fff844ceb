// `fsdp-train vocab-map`: the draft vocabulary mapping of a feature dump, from its token ids and
// loss masks alone (the hidden states are never read), written in SpecForge's file format so a
// draft vocabulary size can be tried without re-dumping (docs/data.md). Runs under mpirun to
// count in parallel.
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/runtime.h"
#include "commands.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/vocab_mapping.h"

namespace fsdp::app {

namespace {

struct VocabMapFlags {
  std::string features;
  std::string out;
  std::string target_model_path;
  int64_t vocab_size = 0;
  int64_t draft_vocab_size = 0;
  int64_t max_length = 2048;
  bool skip_bad_samples = false;
};

// vocab_size of a Hugging Face config.json (top level, else text_config for multimodal models).
int64_t target_vocab_size(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), path + ": cannot open", "check --target-model-path");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    FSDP_USAGE_FAIL(path + ": not valid JSON (" + std::string(e.what()) + ")",
                    "check --target-model-path");
  }
  for (const auto* o : {&j, j.contains("text_config") ? &j["text_config"] : nullptr}) {
    if (o && o->is_object() && o->contains("vocab_size") && (*o)["vocab_size"].is_number_integer())
      return (*o)["vocab_size"].get<int64_t>();
  }
  FSDP_USAGE_FAIL(path + ": has no integer vocab_size",
                  "give the target vocabulary size with --vocab-size");
}

int run_vocab_map(const VocabMapFlags& f) {
  FSDP_USAGE_CHECK(
      (f.vocab_size > 0) != !f.target_model_path.empty(),
      "vocab-map needs the target vocabulary size: one of --vocab-size or "
      "--target-model-path",
      "e.g. --target-model-path /models/Llama-3.1-8B-Instruct, or --vocab-size 128256");
  const int64_t v = f.vocab_size > 0 ? f.vocab_size : target_vocab_size(f.target_model_path);
  FSDP_USAGE_CHECK(f.draft_vocab_size > 0 && f.draft_vocab_size <= v,
                   fsdp::str("--draft-vocab-size ", f.draft_vocab_size, " must be in [1, ", v,
                             "] (the target vocabulary size)"),
                   "use the draft config's draft_vocab_size, e.g. 32000");
  FSDP_USAGE_CHECK(f.max_length >= 2, fsdp::str("--max-length ", f.max_length, " is below 2"),
                   "use the --max-length training will use (SpecForge counts truncated samples)");
  auto comm = comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
  Stopwatch watch;
  data::DatasetOptions dso;
  dso.vocab_size = v;
  auto ds = data::open_feature_dataset(f.features, dso);
  const at::Tensor counts = data::count_loss_tokens(*ds, v, f.max_length, comm.get(),
                                                    f.skip_bad_samples, /*tokens_only=*/true);
  const data::VocabMapping m = data::mapping_from_counts(counts, f.draft_vocab_size);
  at::Tensor io = at::tensor({static_cast<int64_t>(ds->bytes_read()), ds->files_opened()});
  if (comm->size() > 1) comm->all_reduce(io, comm::ReduceOp::kSum)->wait();
  const double seconds = watch.seconds();
  if (comm->rank() == 0) {
    data::save_vocab_mapping(f.out, m);
    const int64_t tokens = counts.sum().item<int64_t>();
    const int64_t distinct = counts.gt(0).sum().item<int64_t>();
    const double coverage = data::mapping_coverage(counts, m);
    uint64_t dump_bytes = 0;
    for (int64_t i = 0; i < ds->size(); ++i) dump_bytes += ds->source_bytes(i);
    std::cout << std::fixed << std::setprecision(2) << "vocab-map: " << ds->size() << " samples ("
              << ds->format() << "), " << tokens << " loss tokens, " << distinct
              << " distinct ids; keeping " << f.draft_vocab_size << " of " << v << " covers "
              << coverage << "% of the loss-token occurrences\n"
              << "vocab-map: read " << io[0].item<int64_t>() << " of " << dump_bytes
              << " bytes of features in " << seconds << " s ("
              << (tokens > 0 ? seconds / (static_cast<double>(tokens) / 1e6) : 0.0)
              << " s per million loss tokens)\n"
              << "vocab-map: wrote " << f.out << " (train with --vocab-mapping-path " << f.out
              << ")\n";
  }
  comm->barrier();
  return 0;
}

}  // namespace

void add_vocab_map(CLI::App& root, Action* action) {
  auto f = std::make_shared<VocabMapFlags>();
  CLI::App* sub = root.add_subcommand(
      "vocab-map",
      "build the draft vocabulary mapping (d2t/t2d, SpecForge's file format) of a feature dump "
      "from its token ids and loss masks only; train with --vocab-mapping-path FILE");
  sub->add_option("--features", f->features, "feature directory, any format (docs/data.md)")
      ->required();
  sub->add_option("--draft-vocab-size", f->draft_vocab_size,
                  "draft vocabulary size (the draft config's draft_vocab_size)")
      ->required();
  sub->add_option("--out", f->out, "mapping file to write (torch.save {d2t, t2d})")->required();
  sub->add_option("--vocab-size", f->vocab_size, "target vocabulary size");
  sub->add_option("--target-model-path", f->target_model_path,
                  "target model directory (its config.json gives the vocabulary size)");
  sub->add_option("--max-length", f->max_length,
                  "count each sample's first N tokens, as training truncates (default 2048)");
  sub->add_flag("--skip-bad-samples", f->skip_bad_samples,
                "leave out unreadable samples (with a warning) instead of stopping");
  sub->callback([action, f]() {
    action->run = [f]() { return run_vocab_map(*f); };
    action->needs_mpi = true;
  });
}

}  // namespace fsdp::app
