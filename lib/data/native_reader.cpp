// Native feature shards: the mmap reader (native_format.h) and its registry entry. Reads only;
// the converter (native_convert.cpp) writes what this reads.
#include "data/native_format.h"

#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "data/dataset_parts.h"
#include "data/formats.h"
#include "data/fp8.h"

namespace fsdp::data {

namespace fs = std::filesystem;
using json = nlohmann::json;
using checkpoint::SafetensorsFile;

std::string native_shard_name(int64_t k, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard_%05lld.%s", static_cast<long long>(k), ext);
  return buf;
}

json read_native_json(const std::string& path) {
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), path + ": cannot open", "check the path");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    FSDP_USAGE_FAIL(path + ": not valid JSON (" + e.what() + ")",
                    "delete the native dataset and run `fsdp-train convert` again");
  }
}

namespace {

class NativeDataset final : public FeatureDataset {
 public:
  NativeDataset(const std::string& dir, DatasetOptions options) : root_(dir), options_(options) {
    const fs::path ip = fs::path(dir) / kNativeIndexFile;
    const json j = read_native_json(ip.string());
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
  bool cheap_tokens() const override { return true; }
  std::string index_file() const override { return (fs::path(root_) / kNativeIndexFile).string(); }
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
      if (k == 2 && !reads_last_hidden(*file, i, where)) continue;
      t[k] = read_tensor(*file, i, kNativeTensorKeys[k], where);
      if (k >= 2 && t[k].scalar_type() == at::kFloat8_e4m3fn) {
        const std::string scale_key = str(kNativeTensorKeys[k], "_scale");
        const std::string name = str(i, ".", scale_key);
        const at::Tensor scale = file->contains(name) ? file->read(name) : at::Tensor();
        t[k] = dequantize_fp8_rows(t[k], scale, where, kNativeTensorKeys[k]);
      }
    }
    uint64_t n = 0;
    for (int k = 0; k < 4; ++k) n += t[k].defined() ? t[k].nbytes() : 0;
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
    int64_t lengths[2] = {ids.size(0), 0};
    for (int k = 0; k < 2; ++k) {
      if (k == 0 && !reads_last_hidden(*file, i, where)) continue;
      const std::string name = str(i, ".", kNativeTensorKeys[2 + k]);
      if (!file->contains(name))
        throw BadSampleError(where + ": tensor '" + name + "' missing from the shard",
                             "the shard does not match the index; convert again", __FILE__,
                             __LINE__);
      const auto& shape = file->info(name).shape;
      lengths[k] = shape.size() == 3 && shape[0] == 1 ? shape[1] : shape.empty() ? 0 : shape[0];
      rows[k] = file->read_rows(name, std::max<int64_t>(from, 0), std::max<int64_t>(count, 0));
    }
    bytes_read_ += ids.nbytes() + mask.nbytes() + (rows[0].defined() ? rows[0].nbytes() : 0) +
                   rows[1].nbytes();
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

  // Whether sample i's last hidden state is read: not when the algorithm has no use for it, nor
  // when convert found none in the source (block-draft features without
  // target_last_hidden_states) and the algorithm can do without; an algorithm that needs it
  // gets a BadSampleError naming the sample's file and the key.
  bool reads_last_hidden(const SafetensorsFile& f, int64_t i, const std::string& where) const {
    using LastHidden = DatasetOptions::LastHidden;
    if (options_.last_hidden == LastHidden::kUnused) return false;
    const std::string name = str(i, ".", kNativeTensorKeys[2]);
    if (f.contains(name)) return true;
    if (options_.last_hidden == LastHidden::kOptional) return false;
    throw BadSampleError(
        str(where, ": no target last hidden state (tensor '", name,
            "' is absent: its source had no target_last_hidden_states), which this draft reads"),
        "dump the features with the target's last hidden state (target_last_hidden_states), "
        "convert them again, or run with --skip-bad-samples",
        __FILE__, __LINE__);
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

}  // namespace

bool is_native_dataset(const std::string& dir) {
  return fs::exists(fs::path(dir) / kNativeIndexFile);
}

std::shared_ptr<FeatureDataset> open_native_dataset(const std::string& dir,
                                                    const DatasetOptions& options) {
  return std::make_shared<NativeDataset>(dir, options);
}

FeatureFormat native_feature_format() {
  return {"native", kNativeIndexFile, FormatDetection::kIndexed,
          [](const std::string& path) -> FeatureOpener {
            if (!is_native_dataset(path)) return {};
            return [path](const DatasetOptions& o) { return open_native_dataset(path, o); };
          }};
}

}  // namespace fsdp::data
