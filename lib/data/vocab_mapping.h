// Draft vocabulary mapping (docs/reference.md §2): which Vd target ids the draft predicts, built
// from the features' own input_ids/loss_mask (no tokenizer), deterministic, cached; or read from a
// SpecForge mapping file. Never guesses: a mapping that does not fit V and Vd is an error.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace fsdp::comm {
class Communicator;
}

namespace fsdp::data {

struct VocabMapping {
  at::Tensor d2t;  // int64 [Vd]: target id of draft index j is j + d2t[j]
  at::Tensor t2d;  // bool [V]: t2d[v] is true when target id v is in the draft vocabulary
  int64_t vocab_size() const { return t2d.size(0); }
  int64_t draft_vocab_size() const { return d2t.size(0); }
  // used[j] = j + d2t[j], ascending int64 [Vd].
  at::Tensor used_ids() const;
};

// counts: int64 [V], occurrences of each id. Keeps the Vd most frequent ids (ties: smaller id
// first), fills with the smallest unused ids when fewer than Vd ids occur, sorts ascending.
VocabMapping mapping_from_counts(const at::Tensor& counts, int64_t draft_vocab_size);

// Percentage (0-100) of the counted occurrences whose id the mapping's t2d keeps: the draft can
// never propose the others. 100 when nothing was counted.
double mapping_coverage(const at::Tensor& counts, const VocabMapping& mapping);

// Counts input_ids at positions with loss_mask == 1 over samples [0, N) of the dataset, reading
// each sample's ORIGINAL (unshifted) input_ids[:max_length] and loss_mask[:max_length], exactly
// as SpecForge counts its tokenized (max_length-truncated) dataset. With `comm`, each rank
// counts a strided subset and the counts are all-reduced. Throws when an id is >= V.
// `tokens_only`: read only input_ids and loss_mask (read_tokens_only), never the hidden states,
// so a sample whose hidden states are damaged is still counted (`fsdp-train vocab-map`).
at::Tensor count_loss_tokens(const FeatureDataset& dataset, int64_t vocab_size, int64_t max_length,
                             comm::Communicator* comm = nullptr, bool skip_bad_samples = true,
                             bool tokens_only = false);

// Reads a torch.save dict {"d2t": int64 [Vd], "t2d": bool [V]} (SpecForge's vocab mapping file)
// without checking its sizes (what a caller deciding whether a file fits needs).
VocabMapping read_vocab_mapping_file(const std::string& path);
// Same, checked against V and Vd and for consistency (t2d true exactly at j + d2t[j]).
VocabMapping load_vocab_mapping(const std::string& path, int64_t vocab_size,
                                int64_t draft_vocab_size);
// Writes the same format (loadable by SpecForge and Python torch.load). Atomic.
void save_vocab_mapping(const std::string& path, const VocabMapping& mapping);

// Where SpecForge's prepare_hidden_states puts the mapping of a dump: <root>/vocab_mapping/
// vocab_mapping.pt.
std::string dump_vocab_mapping_path(const std::string& data_root);

struct VocabMappingOptions {
  std::string mapping_path;  // --vocab-mapping-path: use this file when set
  std::string cache_dir;     // --cache-dir: cache computed mappings here when set
  int64_t vocab_size = 0;
  int64_t draft_vocab_size = 0;
  int64_t max_length = 2048;
  // false (the trainer without --skip-bad-samples): a bad sample met while counting stops the
  // run now, at start-up, rather than when training reaches it.
  bool skip_bad_samples = true;
  // Without mapping_path: take the dump's own <root>/vocab_mapping/vocab_mapping.pt when its sizes
  // match V and Vd (a warning naming both sizes when they do not, then built as below).
  bool use_dump_mapping = true;
};

// The mapping the trainer uses: the given file; else the dump's own mapping file when it fits;
// else the cache entry keyed by (canonical data
// path, max_length, V, Vd, dataset_fingerprint), unless it cannot be read (then recomputed and
// rewritten, with a warning); else computed from the dataset (in parallel over `comm`) and cached
// by rank 0. Every rank returns the same mapping.
VocabMapping build_vocab_mapping(const FeatureDataset& dataset, const VocabMappingOptions& options,
                                 comm::Communicator* comm = nullptr);

// What the vocab cache key takes from the data: the sample count and each feature file's name,
// size and modification time (a native dataset: its index file's), as 16 hex digits. Data
// regenerated in the same directory gets another key, so a stale mapping is never reused.
std::string dataset_fingerprint(const FeatureDataset& dataset);

// Cache file name for a key, e.g. "vocab_mapping_<16 hex digits>.pt" (FNV-1a of the key text).
std::string vocab_cache_file(const std::string& data_path, int64_t max_length, int64_t vocab_size,
                             int64_t draft_vocab_size, const std::string& fingerprint = "");

}  // namespace fsdp::data
