// `fsdp-train gen-toy-data`: writes a synthetic target model, draft config and SpecForge-format
// hidden states with learnable structure (lib/data toy_data.h). For tests and the quickstart
// only; the numbers it produces mean nothing about real models.
#include <CLI/CLI.hpp>

#include <iostream>

#include "commands.h"
#include "data/toy_data.h"

namespace fsdp::app {

void add_gen_toy_data(CLI::App& root, Action* action) {
  auto o = std::make_shared<data::ToyDataOptions>();
  CLI::App* sub = root.add_subcommand(
      "gen-toy-data",
      "write a toy target model (<out>/target), draft config (<out>/draft_config.json) and "
      "SpecForge-format hidden states (<out>/hidden_states) from a Markov chain");
  sub->add_option("--out", o->out_dir, "output directory")->required();
  sub->add_option("--num-samples", o->num_samples, "number of .ckpt samples (default 256)");
  sub->add_option("--min-len", o->min_len, "shortest sample in tokens (default 64)");
  sub->add_option("--max-len", o->max_len, "longest sample in tokens (default 128)");
  sub->add_option("--lengths", o->lengths,
                  "sample lengths in tokens, comma-separated, cycled over the samples (instead "
                  "of uniform lengths in [--min-len, --max-len])")
      ->delimiter(',');
  sub->add_option("--hidden-size", o->hidden_size, "target hidden size H (default 64)");
  sub->add_option("--vocab-size", o->vocab_size, "target vocabulary V (default 512)");
  sub->add_option("--draft-vocab-size", o->draft_vocab_size, "draft vocabulary Vd (default 256)");
  sub->add_option("--successors", o->successors, "Markov chain successors per token (default 4)");
  sub->add_option("--samples-per-dir", o->samples_per_dir,
                  "files per rows_<a>-<b> folder (default 64)");
  sub->add_option("--seed", o->seed, "random seed (default 0)");
  sub->callback([action, o]() {
    action->run = [o]() {
      const auto p = data::generate_toy_data(*o);
      std::cout << "gen-toy-data: target " << p.target_model_dir << ", draft config "
                << p.draft_config << ", " << o->num_samples << " samples ("
                << (p.feature_bytes >> 10) << " KiB) in " << p.hidden_states_dir << "\n";
      return 0;
    };
    action->needs_mpi = false;
  });
}

}  // namespace fsdp::app
