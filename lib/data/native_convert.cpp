// The resumable, rank-parallel converter to native shards (native_convert.h). Never writes into
// the input tree and never publishes a shard (its .done marker) before re-reading it and
// comparing every tensor with what it meant to write.
#include "data/native_convert.h"

#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/safetensors.h"
#include "comm/communicator.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/fp8.h"
#include "data/native_format.h"

namespace fsdp::data {

namespace fs = std::filesystem;
using json = nlohmann::json;
using checkpoint::SafetensorsFile;

namespace {

void write_json_atomic(const fs::path& p, const json& j) {
  const std::string tmp = str(p.string(), ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    FSDP_CHECK(out.good(), tmp + ": cannot create", "check that the directory is writable");
    out << j.dump(1) << "\n";
    FSDP_CHECK(out.good(), tmp + ": write failed", "check free disk space");
  }
  fs::rename(tmp, p);
}

// A shard's .done marker matches the plan and the file on disk: same sources with the same sizes,
// same storage dtype, same file size, and the header holds every expected tensor with the
// recorded length.
bool shard_is_complete(const fs::path& out, int64_t k, const FeatureDataset& input, int64_t first,
                       int64_t end, const std::string& dtype, bool check_finite) {
  const fs::path marker = out / native_shard_name(k, "done");
  const fs::path file = out / native_shard_name(k, "safetensors");
  if (!fs::exists(marker) || !fs::exists(file)) return false;
  try {
    const json m = read_native_json(marker.string());
    const auto& samples = m.at("samples");
    if (static_cast<int64_t>(samples.size()) != end - first) return false;
    if (m.at("bytes").get<uint64_t>() != fs::file_size(file)) return false;
    if (m.value("hidden_dtype", std::string("bf16")) != dtype) return false;
    // Written without the NaN/Inf scan this run asks for: scan it now.
    if (check_finite && !m.value("checked_finite", false)) return false;
    auto f = SafetensorsFile::open(file.string());
    for (int64_t j = first; j < end; ++j) {
      const json& s = samples[j - first];
      if (s.at("source").get<std::string>() != input.source_key(j) ||
          s.at("source_bytes").get<uint64_t>() != input.source_bytes(j))
        return false;
      if (!s.value("bad", "").empty()) continue;
      for (const char* key : kNativeTensorKeys) {
        // A block-draft sample without the target's last hidden state stores none.
        if (key == kNativeTensorKeys[2] && !s.value("last_hidden", true)) continue;
        const std::string name = str(j, ".", key);
        if (!f->contains(name) || f->info(name).shape.at(0) != s.at("length").get<int64_t>())
          return false;
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;  // unreadable marker or shard: convert it again
  }
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> plan_shards(const std::vector<std::string>& files,
                                                     uint64_t shard_bytes) {
  std::vector<uint64_t> sizes;
  for (const auto& f : files) sizes.push_back(fs::file_size(f));
  return plan_shards(sizes, shard_bytes);
}

std::vector<std::pair<int64_t, int64_t>> plan_shards(const std::vector<uint64_t>& sizes,
                                                     uint64_t shard_bytes) {
  std::vector<std::pair<int64_t, int64_t>> plan;
  int64_t first = 0;
  uint64_t acc = 0;
  const int64_t count = static_cast<int64_t>(sizes.size());
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t sz = sizes[i];
    if (i > first && acc + sz > shard_bytes) {
      plan.emplace_back(first, i);
      first = i;
      acc = 0;
    }
    acc += sz;
  }
  if (first < count) plan.emplace_back(first, count);
  return plan;
}

namespace {

using ShardPlan = std::vector<std::pair<int64_t, int64_t>>;

// fp8 shards are version 2, so a binary that predates them refuses the index by its version
// instead of failing on the first fp8 tensor.
int native_version(const std::string& dtype) {
  return dtype == "bf16" ? kNativeFormatVersion : kNativeFp8FormatVersion;
}

void check_convert_options(const ConvertOptions& o) {
  FSDP_USAGE_CHECK(!o.output.empty() && !o.input.empty(), "convert needs --input and --output",
                   "run: fsdp-train convert --input <dir of *.ckpt files> --output <new dir>");
  FSDP_USAGE_CHECK(fs::weakly_canonical(o.input) != fs::weakly_canonical(o.output),
                   "convert: --output must differ from --input",
                   "choose an --output directory other than --input");
  FSDP_USAGE_CHECK(o.shard_bytes > 0, "--shard-size must be positive",
                   "set --shard-size to a positive size, e.g. 512M or 2G");
  FSDP_USAGE_CHECK(o.dtype == "bf16" || o.dtype == "fp8_e4m3",
                   "convert: --dtype '" + o.dtype + "' is not bf16 or fp8_e4m3",
                   "use --dtype bf16 (exact) or --dtype fp8_e4m3 (half the bytes)");
  FSDP_USAGE_CHECK(o.ckpt_keys == "auto" || o.ckpt_keys == "eagle3" || o.ckpt_keys == "block",
                   "convert: --ckpt-keys '" + o.ckpt_keys + "' is not auto, eagle3 or block",
                   "use --ckpt-keys eagle3 (hidden_state, aux_hidden_state) or block "
                   "(hidden_states, target_last_hidden_states), or leave it out (auto)");
}

// The first sample whose `read` succeeds (its index and result), skipping bad ones when the run
// skips them; nullopt when none reads.
template <typename F>
auto first_readable(const ConvertOptions& o, const FeatureDataset& input, F&& read)
    -> std::optional<std::pair<int64_t, decltype(read(int64_t{0}))>> {
  for (int64_t i = 0; i < input.size(); ++i) {
    try {
      return std::pair{i, read(i)};
    } catch (const BadSampleError&) {
      if (!o.skip_bad_samples) throw;
    }
  }
  return std::nullopt;
}

// The dataset options of a .ckpt input: EAGLE3's keys (the defaults) or a block draft's, from
// --ckpt-keys or the first readable file's keys; for block keys the last hidden state is kept
// where present, and the hidden size comes from the first sample's when not given. Other
// formats: the options as given.
DatasetOptions input_options(const ConvertOptions& o, const FeatureDataset& input,
                             std::string* keys_out) {
  DatasetOptions dso = o.dataset;
  if (input.format() != "ckpt") {
    FSDP_USAGE_CHECK(o.ckpt_keys == "auto",
                     str("convert: --ckpt-keys ", o.ckpt_keys, " with ", o.input, " in the '",
                         input.format(), "' format, which names its tensors itself"),
                     "drop --ckpt-keys (it chooses the keys of SpecForge .ckpt files)");
    return dso;
  }
  std::string keys = o.ckpt_keys;
  if (keys == "auto") {
    const auto names =
        first_readable(o, input, [&](int64_t i) { return read_ckpt_key_names(input.source(i)); });
    if (names) {
      const auto& n = names->second;
      const auto has = [&n](const char* k) { return std::find(n.begin(), n.end(), k) != n.end(); };
      const bool eagle3 = has("aux_hidden_state"), block = has("hidden_states");
      FSDP_USAGE_CHECK(
          !(eagle3 && block),
          str(input.source(names->first),
              ": holds both EAGLE3's keys (hidden_state, aux_hidden_state) and a block draft's "
              "(hidden_states, target_last_hidden_states): convert cannot tell which to keep"),
          "pass --ckpt-keys eagle3 or --ckpt-keys block");
      keys = block ? "block" : "eagle3";
    } else {
      keys = "eagle3";  // every file is bad: each is recorded as such
    }
  }
  *keys_out = keys;
  if (keys == "eagle3") return dso;
  dso.hidden_key = "target_last_hidden_states";
  dso.aux_key = "hidden_states";
  dso.last_hidden = DatasetOptions::LastHidden::kOptional;
  if (dso.hidden_size == 0) {
    // The first readable file's keys, then its last state's width.
    const auto first = first_readable(o, input, [&](int64_t i) {
      const auto names = read_ckpt_key_names(input.source(i));
      return std::find(names.begin(), names.end(), dso.hidden_key) != names.end();
    });
    if (first) {
      FSDP_USAGE_CHECK(
          first->second,
          str(input.source(first->first),
              ": block-draft features without target_last_hidden_states: the hidden size cannot "
              "be told from hidden_states [S, n x H] alone"),
          "pass --target-model-path (the target the features come from), which gives it");
      dso.hidden_size = read_ckpt_sample(input.source(first->first), dso).hidden_size();
    }
  }
  return dso;
}

// What one shard holds once its .ckpt files are read: the tensors to write, the marker's
// per-sample lines (bad ones included when skipped) and the samples kept.
struct ShardContents {
  checkpoint::NamedTensors tensors;
  json samples = json::array();
  std::vector<RawSample> kept;
  int64_t hidden = 0;
};

ShardContents read_shard_samples(const ConvertOptions& o, const FeatureDataset& input,
                                 int64_t first, int64_t end, ConvertReport& rep) {
  ShardContents c;
  const bool fp8 = o.dtype == "fp8_e4m3";
  for (int64_t j = first; j < end; ++j) {
    json s = {{"source", input.source_key(j)}, {"source_bytes", input.source_bytes(j)}};
    try {
      RawSample r = input.read(j);
      // A block-draft sample may have no last hidden state: its size is the dataset's.
      const int64_t h = r.hidden_state.defined() ? r.hidden_size() : o.dataset.hidden_size;
      FSDP_USAGE_CHECK(c.hidden == 0 || h == c.hidden,
                       str(input.source(j), ": hidden size ", h, " differs from ", c.hidden,
                           " in the same dataset"),
                       "all features must come from one target model");
      c.hidden = h;
      s["length"] = r.length();
      if (!r.hidden_state.defined()) s["last_hidden"] = false;
      c.tensors.emplace_back(str(j, ".input_ids"), r.input_ids);
      c.tensors.emplace_back(str(j, ".loss_mask"), r.loss_mask);
      for (const bool aux : {false, true}) {
        const at::Tensor& t = aux ? r.aux_hidden_state : r.hidden_state;
        const char* key = aux ? "aux_hidden_state" : "hidden_state";
        if (!t.defined()) continue;
        if (!fp8) {
          c.tensors.emplace_back(str(j, ".", key), t);
          continue;
        }
        Fp8Rows q = quantize_fp8_rows(t, aux ? t.size(1) / c.hidden : 1);
        c.tensors.emplace_back(str(j, ".", key), q.q);
        c.tensors.emplace_back(str(j, ".", key, "_scale"), q.scale);
      }
      c.kept.push_back(std::move(r));
    } catch (const BadSampleError& e) {
      if (!o.skip_bad_samples) throw;
      s["length"] = 0;
      s["bad"] = e.message();
      rep.bad_sample_lines.push_back(e.message());
    }
    c.samples.push_back(std::move(s));
  }
  return c;
}

// Re-reads every tensor of a written shard through the reader and compares it with what was meant.
void verify_shard(const fs::path& file, const checkpoint::NamedTensors& tensors) {
  auto f = SafetensorsFile::open(file.string());
  for (const auto& [name, t] : tensors) {
    // Byte for byte (at::equal would call NaN != NaN, which --no-check-finite lets through).
    const at::Tensor back = f->contains(name) ? f->read(name).contiguous() : at::Tensor();
    const at::Tensor meant = t.contiguous();
    FSDP_CHECK(back.defined() && back.scalar_type() == meant.scalar_type() &&
                   back.sizes() == meant.sizes() &&
                   std::memcmp(back.data_ptr(), meant.data_ptr(), meant.nbytes()) == 0,
               file.string() + ": verification failed for tensor '" + name + "'",
               "the disk or file system corrupts data; check it, then run convert again");
  }
}

// Shard k: read, write, verify, then publish its .done marker.
void convert_shard(const ConvertOptions& o, const FeatureDataset& input, const fs::path& out,
                   int64_t k, int64_t first, int64_t end, ConvertReport& rep) {
  const ShardContents c = read_shard_samples(o, input, first, end, rep);
  const fs::path file = out / native_shard_name(k, "safetensors");
  const uint64_t bytes =
      checkpoint::write_safetensors(file.string(), c.tensors,
                                    {{"format", kNativeFormatName},
                                     {"version", std::to_string(native_version(o.dtype))},
                                     {"hidden_dtype", o.dtype},
                                     {"first_sample", std::to_string(first)},
                                     {"num_samples", std::to_string(end - first)}});
  verify_shard(file, c.tensors);
  write_json_atomic(out / native_shard_name(k, "done"), {{"shard", k},
                                                         {"bytes", bytes},
                                                         {"hidden_size", c.hidden},
                                                         {"hidden_dtype", o.dtype},
                                                         {"checked_finite", o.dataset.check_finite},
                                                         {"samples", c.samples}});
  ++rep.shards_written;
  rep.samples_written += static_cast<int64_t>(c.kept.size());
  rep.bytes_written += bytes;
  FSDP_LOG(kInfo) << "convert: wrote " << file.string() << " (" << c.kept.size() << " samples, "
                  << (bytes >> 20) << " MiB)";
}

// Every rank reads all markers (small JSON) for the totals; rank 0 writes the index.
void write_index(const ConvertOptions& o, const FeatureDataset& input, const ShardPlan& plan,
                 const fs::path& out, int rank, ConvertReport& rep) {
  json shards = json::array(), samples = json::array();
  int64_t hidden = 0;
  bool checked_finite = true;  // every shard's samples were scanned for NaN/Inf
  for (int64_t k = 0; k < rep.shards_total; ++k) {
    const json m = read_native_json((out / native_shard_name(k, "done")).string());
    checked_finite = checked_finite && m.value("checked_finite", false);
    shards.push_back({{"file", native_shard_name(k, "safetensors")},
                      {"first_sample", plan[k].first},
                      {"num_samples", plan[k].second - plan[k].first},
                      {"bytes", m.at("bytes")}});
    if (m.value("hidden_size", int64_t{0}) > 0) hidden = m["hidden_size"].get<int64_t>();
    for (const auto& s : m.at("samples")) {
      json e = {{"shard", k}, {"length", s.at("length")}, {"source", s.at("source")}};
      if (!s.value("bad", "").empty()) {
        e["bad"] = s["bad"];
        ++rep.bad_samples;
      }
      samples.push_back(std::move(e));
    }
  }
  if (rank == 0) {
    write_json_atomic(out / kNativeIndexFile,
                      {{"format", kNativeFormatName},
                       {"version", native_version(o.dtype)},
                       {"hidden_dtype", o.dtype},
                       {"hidden_size", hidden},
                       {"hidden_state_prenorm", input.hidden_state_prenorm()},
                       {"captured_layer_ids", input.captured_layer_ids()},
                       {"checked_finite", checked_finite},
                       {"source_format", input.format()},
                       {"num_samples", samples.size()},
                       {"source", fs::weakly_canonical(o.input).string()},
                       {"shards", shards},
                       {"samples", samples}});
  }
}

}  // namespace

ConvertReport convert_to_native(const ConvertOptions& given, comm::Communicator* comm) {
  Stopwatch watch;
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  check_convert_options(given);
  auto input = open_feature_dataset(given.input, given.dataset);
  FSDP_USAGE_CHECK(input->size() > 0, given.input + ": no samples found", "check --input");
  ConvertReport rep;
  ConvertOptions o = given;
  o.dataset = input_options(given, *input, &rep.input_keys);
  if (rep.input_keys == "block") input = open_feature_dataset(o.input, o.dataset);
  std::vector<uint64_t> sizes;
  for (int64_t i = 0; i < input->size(); ++i) sizes.push_back(input->source_bytes(i));
  const auto plan = plan_shards(sizes, o.shard_bytes);
  const fs::path out(o.output);
  make_dirs(out.string(), "check --output (a directory that can be created and written)");

  rep.input_format = input->format();
  rep.shards_total = static_cast<int64_t>(plan.size());
  for (int64_t k = rank; k < rep.shards_total; k += world) {
    const auto [first, end] = plan[k];
    if (!o.overwrite &&
        shard_is_complete(out, k, *input, first, end, o.dtype, o.dataset.check_finite)) {
      ++rep.shards_skipped;
      continue;
    }
    convert_shard(o, *input, out, k, first, end, rep);
  }
  if (comm) comm->barrier();
  write_index(o, *input, plan, out, rank, rep);
  if (comm) comm->barrier();
  rep.seconds = watch.seconds();
  return rep;
}

}  // namespace fsdp::data
