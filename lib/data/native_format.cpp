// Native feature shards: the mmap reader and the resumable, rank-parallel converter
// (native_format.h). The converter never writes into the input tree and never publishes a shard
// (its .done marker) before re-reading it and comparing every tensor with what it meant to write.
#include "data/native_format.h"

#include <ATen/ATen.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "comm/communicator.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/dataset_parts.h"
#include "data/fp8.h"

namespace fsdp::data {

namespace fs = std::filesystem;
using json = nlohmann::json;
using checkpoint::SafetensorsFile;

namespace {

const char* kTensorKeys[4] = {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"};

std::string shard_name(int64_t k, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard_%05lld.%s", static_cast<long long>(k), ext);
  return buf;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  FSDP_USAGE_CHECK(in.good(), p.string() + ": cannot open", "check the path");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    FSDP_USAGE_FAIL(p.string() + ": not valid JSON (" + e.what() + ")",
                    "delete the native dataset and run `fsdp-train convert` again");
  }
}

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

class NativeDataset final : public FeatureDataset {
 public:
  NativeDataset(const std::string& dir, DatasetOptions options) : root_(dir), options_(options) {
    const fs::path ip = fs::path(dir) / kNativeIndexFile;
    const json j = read_json(ip);
    const std::string where = ip.string();
    auto need = [&](bool ok, const std::string& what) {
      FSDP_USAGE_CHECK(ok, where + ": " + what,
                       "re-run `fsdp-train convert` into an empty directory");
    };
    need(j.is_object() && j.value("format", "") == kNativeFormatName,
         "not a fsdp-train feature index");
    const int version = j.value("version", 0);
    need(version == kNativeFormatVersion || version == kNativeFp8FormatVersion,
         str("format version ", version, " is not supported (expected ", kNativeFormatVersion,
             " or ", kNativeFp8FormatVersion, ")"));
    hidden_dtype_ = j.value("hidden_dtype", std::string("bf16"));
    need(hidden_dtype_ == "bf16" || hidden_dtype_ == "fp8_e4m3",
         "hidden_dtype '" + hidden_dtype_ + "' is not bf16 or fp8_e4m3");
    need(j.contains("shards") && j["shards"].is_array() && j.contains("samples") &&
             j["samples"].is_array(),
         "missing shards or samples list");
    hidden_size_ = j.value("hidden_size", int64_t{0});
    prenorm_ = j.value("hidden_state_prenorm", false);
    checked_finite_ = j.value("checked_finite", false);
    if (j.contains("captured_layer_ids") && j["captured_layer_ids"].is_array())
      captured_ = j["captured_layer_ids"].get<std::vector<int64_t>>();
    if (options_.hidden_size > 0 && hidden_size_ > 0)
      FSDP_USAGE_CHECK(
          hidden_size_ == options_.hidden_size,
          str(where, ": hidden size ", hidden_size_, " but the target has ", options_.hidden_size),
          "convert features produced by the same target model");
    for (const auto& s : j["shards"])
      shards_.push_back((fs::path(dir) / s.at("file").get<std::string>()).string());
    for (const auto& s : j["samples"]) {
      Entry e;
      e.shard = s.at("shard").get<int64_t>();
      e.length = s.value("length", int64_t{0});
      e.source = s.value("source", "");
      e.bad = s.value("bad", "");
      need(e.shard >= 0 && e.shard < static_cast<int64_t>(shards_.size()),
           str("sample ", entries_.size(), " names shard ", e.shard, " of ", shards_.size()));
      entries_.push_back(std::move(e));
    }
  }

  std::string format() const override { return "native"; }
  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }
  const std::string& root() const override { return root_; }
  bool hidden_state_prenorm() const override { return prenorm_; }
  std::vector<int64_t> captured_layer_ids() const override { return captured_; }
  std::string source(int64_t i) const override {
    const auto& e = entries_.at(i);
    return str(shards_[e.shard], "[", i, "]", e.source.empty() ? "" : " (from " + e.source + ")");
  }
  std::string source_key(int64_t i) const override {
    return str(fs::path(shards_[entries_.at(i).shard]).filename().string(), "[", i, "]");
  }
  uint64_t source_bytes(int64_t i) const override {
    // Per token: two int64 ids/mask, and H + n*H hidden values (bf16, or fp8 plus scales).
    const int64_t h = hidden_size_, n = options_.num_aux_layers > 0 ? options_.num_aux_layers : 3;
    const bool fp8 = hidden_dtype_ == "fp8_e4m3";
    const int64_t per_token = 16 + (fp8 ? (h + n * h) + 4 * (1 + n) : 2 * (h + n * h));
    return static_cast<uint64_t>(entries_.at(i).length * per_token);
  }

  RawSample read(int64_t i) const override {
    const auto [file, where] = locate(i);
    at::Tensor t[4];
    for (int k = 0; k < 4; ++k) {
      t[k] = read_tensor(*file, i, kTensorKeys[k], where);
      if (k >= 2 && t[k].scalar_type() == at::kFloat8_e4m3fn) {
        const std::string scale_key = str(kTensorKeys[k], "_scale");
        const std::string name = str(i, ".", scale_key);
        const at::Tensor scale = file->contains(name) ? file->read(name) : at::Tensor();
        t[k] = dequantize_fp8_rows(t[k], scale, where, kTensorKeys[k]);
      }
    }
    uint64_t n = 0;
    for (int k = 0; k < 4; ++k) n += t[k].nbytes();
    bytes_read_ += n;
    return validate_sample(t[0], t[1], t[2], t[3], where, options_);
  }

  // Rows alone only where every rank of a sequence-parallel group reaches the same verdict on
  // a sample without reading all of it: bf16 rows (fp8 rows are dequantised with scales over the
  // whole sample) whose NaN/Inf scan convert already made (index "checked_finite"), or with the
  // scan off. A scan of one slice could skip a sample on one rank and not on the others.
  bool reads_rows() const override {
    return hidden_dtype_ != "fp8_e4m3" && (checked_finite_ || !options_.check_finite);
  }

  RawSample read_rows(int64_t i, int64_t from, int64_t count) const override {
    if (!reads_rows()) return FeatureDataset::read_rows(i, from, count);
    const auto [file, where] = locate(i);
    const at::Tensor ids = read_tensor(*file, i, "input_ids", where);
    const at::Tensor mask = read_tensor(*file, i, "loss_mask", where);
    at::Tensor rows[2];
    int64_t lengths[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const std::string name = str(i, ".", kTensorKeys[2 + k]);
      if (!file->contains(name))
        throw BadSampleError(where + ": tensor '" + name + "' missing from the shard",
                             "the shard does not match the index; convert again", __FILE__,
                             __LINE__);
      const auto& shape = file->info(name).shape;
      lengths[k] = shape.size() == 3 && shape[0] == 1 ? shape[1] : shape.empty() ? 0 : shape[0];
      rows[k] = file->read_rows(name, std::max<int64_t>(from, 0), std::max<int64_t>(count, 0));
    }
    bytes_read_ += ids.nbytes() + mask.nbytes() + rows[0].nbytes() + rows[1].nbytes();
    const RowWindow window{std::min(std::max<int64_t>(from, 0), lengths[0]), lengths[0],
                           lengths[1]};
    DatasetOptions options = options_;
    options.check_finite = false;  // convert scanned every row (reads_rows)
    return validate_sample(ids, mask, rows[0], rows[1], where, options, &window);
  }

  TokenSample read_tokens(int64_t i) const override {
    const auto [file, where] = locate(i);
    const at::Tensor ids = read_tensor(*file, i, "input_ids", where);
    const at::Tensor mask = read_tensor(*file, i, "loss_mask", where);
    bytes_read_ += ids.nbytes() + mask.nbytes();
    return validate_tokens_only(ids, mask, where, options_);
  }

 private:
  struct Entry {
    int64_t shard = 0;
    int64_t length = 0;
    std::string source;
    std::string bad;  // problem recorded by convert --skip-bad-samples
  };

  std::pair<std::shared_ptr<SafetensorsFile>, std::string> locate(int64_t i) const {
    FSDP_CHECK(i >= 0 && i < size(), str("sample index ", i, " out of range [0, ", size(), ")"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    const Entry& e = entries_[i];
    const std::string where = source(i);
    if (!e.bad.empty())
      throw BadSampleError(where + ": marked bad by convert: " + e.bad,
                           "run with --skip-bad-samples, or fix the source file and convert again",
                           __FILE__, __LINE__);
    try {
      return {shard(e.shard), where};
    } catch (const UsageError& err) {
      throw BadSampleError(err.message(), err.hint(), __FILE__, __LINE__);
    }
  }

  at::Tensor read_tensor(const SafetensorsFile& f, int64_t i, const char* key,
                         const std::string& where) const {
    const std::string name = str(i, ".", key);
    if (!f.contains(name))
      throw BadSampleError(where + ": tensor '" + name + "' missing from the shard",
                           "the shard does not match the index; convert again", __FILE__, __LINE__);
    return f.read(name);
  }

  // Small LRU of mapped shards: mapping is cheap, but keeping every shard of a multi-TB dataset
  // mapped would make resident memory look huge as pages are touched.
  std::shared_ptr<SafetensorsFile> shard(int64_t k) const {
    return open_.get(
        k, [&] { return SafetensorsFile::open(shards_[k]); }, files_opened_);
  }

  std::string root_;
  DatasetOptions options_;
  int64_t hidden_size_ = 0;
  std::string hidden_dtype_ = "bf16";
  bool checked_finite_ = false;  // index: convert scanned every sample for NaN/Inf
  bool prenorm_ = false;
  std::vector<int64_t> captured_;
  std::vector<std::string> shards_;
  std::vector<Entry> entries_;
  OpenShardCache<int64_t, SafetensorsFile> open_;
};

// A shard's .done marker matches the plan and the file on disk: same sources with the same sizes,
// same storage dtype, same file size, and the header holds every expected tensor with the
// recorded length.
bool shard_is_complete(const fs::path& out, int64_t k, const FeatureDataset& input, int64_t first,
                       int64_t end, const std::string& dtype, bool check_finite) {
  const fs::path marker = out / shard_name(k, "done");
  const fs::path file = out / shard_name(k, "safetensors");
  if (!fs::exists(marker) || !fs::exists(file)) return false;
  try {
    const json m = read_json(marker);
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
      for (const char* key : kTensorKeys) {
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

bool is_native_dataset(const std::string& dir) {
  return fs::exists(fs::path(dir) / kNativeIndexFile);
}

std::shared_ptr<FeatureDataset> open_native_dataset(const std::string& dir,
                                                    const DatasetOptions& options) {
  return std::make_shared<NativeDataset>(dir, options);
}

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
      FSDP_USAGE_CHECK(c.hidden == 0 || r.hidden_size() == c.hidden,
                       str(input.source(j), ": hidden size ", r.hidden_size(), " differs from ",
                           c.hidden, " in the same dataset"),
                       "all features must come from one target model");
      c.hidden = r.hidden_size();
      s["length"] = r.length();
      c.tensors.emplace_back(str(j, ".input_ids"), r.input_ids);
      c.tensors.emplace_back(str(j, ".loss_mask"), r.loss_mask);
      for (const bool aux : {false, true}) {
        const at::Tensor& t = aux ? r.aux_hidden_state : r.hidden_state;
        const char* key = aux ? "aux_hidden_state" : "hidden_state";
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
  const fs::path file = out / shard_name(k, "safetensors");
  const uint64_t bytes =
      checkpoint::write_safetensors(file.string(), c.tensors,
                                    {{"format", kNativeFormatName},
                                     {"version", std::to_string(native_version(o.dtype))},
                                     {"hidden_dtype", o.dtype},
                                     {"first_sample", std::to_string(first)},
                                     {"num_samples", std::to_string(end - first)}});
  verify_shard(file, c.tensors);
  write_json_atomic(out / shard_name(k, "done"), {{"shard", k},
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
    const json m = read_json(out / shard_name(k, "done"));
    checked_finite = checked_finite && m.value("checked_finite", false);
    shards.push_back({{"file", shard_name(k, "safetensors")},
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

ConvertReport convert_to_native(const ConvertOptions& o, comm::Communicator* comm) {
  Stopwatch watch;
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  check_convert_options(o);
  const auto input = open_feature_dataset(o.input, o.dataset);
  FSDP_USAGE_CHECK(input->size() > 0, o.input + ": no samples found", "check --input");
  std::vector<uint64_t> sizes;
  for (int64_t i = 0; i < input->size(); ++i) sizes.push_back(input->source_bytes(i));
  const auto plan = plan_shards(sizes, o.shard_bytes);
  const fs::path out(o.output);
  make_dirs(out.string(), "check --output (a directory that can be created and written)");

  ConvertReport rep;
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
