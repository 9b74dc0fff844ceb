// Draft vocabulary mapping: counting, selection, SpecForge file I/O and the cache
// (vocab_mapping.h, docs/reference.md §2).
#include "data/vocab_mapping.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <numeric>

#include "comm/communicator.h"
#include "core/fs_util.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/torch_archive_load.h"
#include "data/torch_save.h"

namespace fsdp::data {

namespace fs = std::filesystem;

at::Tensor VocabMapping::used_ids() const {
  return d2t + at::arange(d2t.size(0), d2t.options());
}

VocabMapping mapping_from_counts(const at::Tensor& counts_in, int64_t vd) {
  const at::Tensor counts = counts_in.to(at::kLong).contiguous();
  const int64_t v = counts.size(0);
  FSDP_USAGE_CHECK(vd >= 1 && vd <= v,
                   fsdp::str("draft_vocab_size ", vd, " must be in [1, vocab_size ", v, "]"),
                   "fix draft_vocab_size in the draft config");
  const int64_t* c = counts.data_ptr<int64_t>();
  std::vector<int64_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  // Most frequent first, ties by smaller id; ids that never occur (count 0) then come in
  // ascending order, which is exactly "fill with the smallest unused ids".
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
  std::vector<int64_t> used(order.begin(), order.begin() + vd);
  std::sort(used.begin(), used.end());
  VocabMapping m;
  m.d2t = at::empty({vd}, at::kLong);
  m.t2d = at::zeros({v}, at::kBool);
  auto* d = m.d2t.data_ptr<int64_t>();
  auto* t = m.t2d.data_ptr<bool>();
  for (int64_t j = 0; j < vd; ++j) {
    d[j] = used[j] - j;
    t[used[j]] = true;
  }
  return m;
}

at::Tensor count_loss_tokens(const FeatureDataset& dataset, int64_t vocab_size, int64_t max_length,
                             comm::Communicator* comm, bool skip_bad_samples, bool tokens_only) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  at::Tensor counts = at::zeros({vocab_size}, at::kLong);
  for (int64_t i = rank; i < dataset.size(); i += world) {
    TokenSample s;
    try {
      s = tokens_only ? dataset.read_tokens_only(i) : dataset.read_tokens(i);
    } catch (const SampleReadError&) {
      if (!skip_bad_samples) throw;  // (the loader would retry it; at start-up, say so now)
      FSDP_LOG(kWarn) << "vocab mapping: not counting a sample that could not be read";
      continue;
    } catch (const BadSampleError& e) {
      if (!skip_bad_samples) throw;
      // Skipped samples never reach training, so they are not counted; the loader reports them
      // again.
      FSDP_LOG(kWarn) << "vocab mapping: not counting " << e.message();
      continue;
    }
    const int64_t n = std::min<int64_t>(s.input_ids.size(0), max_length);
    at::Tensor ids = s.input_ids.narrow(0, 0, n).masked_select(s.loss_mask.narrow(0, 0, n).eq(1));
    if (ids.numel() == 0) continue;
    const int64_t hi = ids.max().item<int64_t>();
    FSDP_USAGE_CHECK(hi < vocab_size,
                     fsdp::str(dataset.source(i), ": token id ", hi, " >= vocab_size ", vocab_size),
                     "the features come from another tokenizer than the target model's");
    counts += at::bincount(ids, {}, vocab_size);
  }
  if (comm && world > 1) comm->all_reduce(counts, comm::ReduceOp::kSum)->wait();
  return counts;
}

VocabMapping read_vocab_mapping_file(const std::string& path) {
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    FSDP_USAGE_CHECK(in.good(), path + ": cannot open vocab mapping file",
                     "check --vocab-mapping-path");
    bytes.resize(static_cast<size_t>(in.tellg()));
    in.seekg(0);
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  c10::IValue iv;
  try {
    iv = load_torch_archive(bytes);
  } catch (const FormatError& e) {
    FSDP_USAGE_FAIL(path + ": not a readable torch.save file with {d2t, t2d}: " + e.what(),
                    "pass a file written by SpecForge (torch.save({'d2t':..., 't2d':...}))");
  }
  FSDP_USAGE_CHECK(iv.isGenericDict(), path + ": holds no dict",
                   "expected torch.save({'d2t', 't2d'})");
  VocabMapping m;
  for (const auto& kv : iv.toGenericDict()) {
    if (!kv.key().isString() || !kv.value().isTensor()) continue;
    if (kv.key().toStringRef() == "d2t") m.d2t = kv.value().toTensor();
    if (kv.key().toStringRef() == "t2d") m.t2d = kv.value().toTensor();
  }
  FSDP_USAGE_CHECK(m.d2t.defined() && m.t2d.defined(), path + ": needs tensors 'd2t' and 't2d'",
                   "point --vocab-mapping-path at the d2t/t2d file SpecForge wrote");
  return m;
}

VocabMapping load_vocab_mapping(const std::string& path, int64_t v, int64_t vd) {
  VocabMapping m = read_vocab_mapping_file(path);
  FSDP_USAGE_CHECK(m.d2t.dim() == 1 && m.d2t.size(0) == vd,
                   fsdp::str(path, ": d2t has shape ", m.d2t.sizes(), ", expected [", vd,
                             "] (draft_vocab_size)"),
                   "the mapping was built for another draft vocabulary size");
  FSDP_USAGE_CHECK(
      m.t2d.dim() == 1 && m.t2d.size(0) == v,
      fsdp::str(path, ": t2d has shape ", m.t2d.sizes(), ", expected [", v, "] (vocab_size)"),
      "the mapping was built for another target vocabulary");
  m.d2t = m.d2t.to(at::kLong).contiguous();
  m.t2d = m.t2d.to(at::kBool).contiguous();
  const at::Tensor used = m.used_ids();
  const bool ok =
      used.min().item<int64_t>() >= 0 && used.max().item<int64_t>() < v &&
      (vd == 1 || (used.narrow(0, 1, vd - 1) > used.narrow(0, 0, vd - 1)).all().item<bool>()) &&
      m.t2d.sum().item<int64_t>() == vd && m.t2d.index_select(0, used).all().item<bool>();
  FSDP_USAGE_CHECK(
      ok, path + ": d2t and t2d disagree (t2d must be true exactly at j + d2t[j], ascending)",
      "regenerate the mapping file");
  return m;
}

void save_vocab_mapping(const std::string& path, const VocabMapping& m) {
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("d2t", m.d2t);
  dict.insert("t2d", m.t2d);
  torch_save_file(path, dict);
}

double mapping_coverage(const at::Tensor& counts, const VocabMapping& mapping) {
  const double total = counts.sum().item<double>();
  if (total <= 0) return 100.0;
  return 100.0 * counts.masked_select(mapping.t2d.to(at::kBool)).sum().item<double>() / total;
}

std::string dump_vocab_mapping_path(const std::string& data_root) {
  return (fs::path(data_root) / "vocab_mapping" / "vocab_mapping.pt").string();
}

std::string vocab_cache_file(const std::string& data_path, int64_t max_length, int64_t v,
                             int64_t vd, const std::string& fingerprint) {
  const std::string key = fsdp::str(
      fs::weakly_canonical(data_path).string(), "|max_length=", max_length, "|vocab_size=", v,
      "|draft_vocab_size=", vd, fingerprint.empty() ? "" : "|files=" + fingerprint);
  const uint64_t h = fsdp::fnv1a(key);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "vocab_mapping_%016llx.pt", static_cast<unsigned long long>(h));
  return buf;
}

std::string dataset_fingerprint(const FeatureDataset& dataset) {
  // FNV-1a over: the sample count, and per file its name, size and modification time (a native
  // dataset: its index, which convert rewrites with every shard).
  uint64_t h = fsdp::kFnv1aOffset;
  const auto mix = [&h](const std::string& s) { h = fsdp::fnv1a(s, h); };
  const auto mix_file = [&](const std::string& path) {
    struct stat st {};
    mix(path);
    if (::stat(path.c_str(), &st) == 0) {
      mix(fsdp::str("|", st.st_size, "|", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "\n"));
    } else {
      mix("|missing\n");
    }
  };
  mix(fsdp::str(dataset.size(), "\n"));
  if (const std::string index = dataset.index_file(); !index.empty()) {
    mix_file(index);
  } else {
    for (int64_t i = 0; i < dataset.size(); ++i) mix_file(dataset.source(i));
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {
// Rank 0's fingerprint on every rank: one stat() pass, and the same cache key where ranks read
// node-local copies of the data (whose modification times differ).
std::string shared_fingerprint(const FeatureDataset& dataset, comm::Communicator* comm) {
  if (!comm || comm->size() == 1) return dataset_fingerprint(dataset);
  at::Tensor v = at::zeros({1}, at::kLong);
  if (comm->rank() == 0) {
    v[0] = static_cast<int64_t>(std::stoull(dataset_fingerprint(dataset), nullptr, 16));
  }
  comm->broadcast(v, 0)->wait();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(static_cast<uint64_t>(v.item<int64_t>())));
  return buf;
}
}  // namespace

VocabMapping build_vocab_mapping(const FeatureDataset& dataset, const VocabMappingOptions& o,
                                 comm::Communicator* comm) {
  FSDP_USAGE_CHECK(o.vocab_size > 0 && o.draft_vocab_size > 0,
                   "vocab mapping needs vocab_size and draft_vocab_size", "check the draft config");
  if (!o.mapping_path.empty())
    return load_vocab_mapping(o.mapping_path, o.vocab_size, o.draft_vocab_size);
  // SpecForge's prepare_hidden_states writes the mapping of its dump next to the features.
  const std::string beside = dump_vocab_mapping_path(dataset.root());
  if (o.use_dump_mapping && fs::exists(beside)) {
    const VocabMapping found = read_vocab_mapping_file(beside);
    if (found.d2t.dim() == 1 && found.t2d.dim() == 1 && found.d2t.size(0) == o.draft_vocab_size &&
        found.t2d.size(0) == o.vocab_size) {
      FSDP_LOG0(kInfo) << "vocab mapping: " << beside << " (the dump's own mapping)";
      return load_vocab_mapping(beside, o.vocab_size, o.draft_vocab_size);
    }
    FSDP_LOG0(kWarn) << "vocab mapping: not using " << beside << ": it maps " << found.t2d.numel()
                     << " target ids to " << found.d2t.numel()
                     << " draft ids, the draft config has vocab_size " << o.vocab_size
                     << " and draft_vocab_size " << o.draft_vocab_size
                     << "; building one from the features instead";
  }
  std::string cache;
  if (!o.cache_dir.empty()) {
    cache = (fs::path(o.cache_dir) / "vocab_mapping" /
             vocab_cache_file(dataset.root(), o.max_length, o.vocab_size, o.draft_vocab_size,
                              shared_fingerprint(dataset, comm)))
                .string();
    // Every rank sees the same file system state here: either all load or all compute.
    if (comm) comm->barrier();
    VocabMapping cached;
    std::string problem;
    if (fs::exists(cache)) {
      try {
        cached = load_vocab_mapping(cache, o.vocab_size, o.draft_vocab_size);
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    at::Tensor missing = at::full({1}, cached.d2t.defined() ? 0 : 1, at::kInt);
    if (comm) comm->all_reduce(missing, comm::ReduceOp::kMax)->wait();
    if (missing.item<int>() == 0) {
      FSDP_LOG0(kInfo) << "vocab mapping: using cache " << cache;
      return cached;
    }
    if (!problem.empty()) {
      FSDP_LOG0(kWarn) << "vocab mapping: the cache file " << cache << " cannot be used ("
                       << problem << "); computing it again";
    }
  }
  const at::Tensor counts =
      count_loss_tokens(dataset, o.vocab_size, o.max_length, comm, o.skip_bad_samples);
  VocabMapping m = mapping_from_counts(counts, o.draft_vocab_size);
  const int64_t distinct = counts.gt(0).sum().item<int64_t>();
  // Coverage bounds every acc_i: the draft can never propose the ids it does not keep.
  FSDP_LOG0(kInfo) << "vocab mapping: " << distinct << " distinct loss tokens, keeping "
                   << o.draft_vocab_size << " of " << o.vocab_size << ", which cover "
                   << fsdp::str(std::fixed, std::setprecision(2), mapping_coverage(counts, m))
                   << "% of the loss-token occurrences";
  if (!cache.empty() && (!comm || comm->rank() == 0)) {
    // The cache only saves the next run this pass: a cache that cannot be written is a warning.
    try {
      make_dirs(fs::path(cache).parent_path().string(), "check --cache-dir");
      save_vocab_mapping(cache, m);
    } catch (const std::exception& e) {
      FSDP_LOG(kWarn) << "vocab mapping: not cached (" << e.what() << "); check --cache-dir";
    }
  }
  return m;
}

}  // namespace fsdp::data
