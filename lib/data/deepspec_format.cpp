// DeepSpec target caches (formats.h): manifest.json, samples.idx (48-byte records) and raw shards
// holding each sample's tensors back to back. Opening reads the manifest and the index only; a
// sample's bytes are read from its shard on demand, and no offset is used before it is checked
// against the shard's size.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>

#include "data/dataset_parts.h"
#include "data/formats.h"

namespace fsdp::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kIndexFile = "samples.idx";
constexpr int64_t kManifestVersion = 2;
// struct.Struct("<QIIQQQQQ").size in DeepSpec: 8 + 4 + 4 + 5 x 8 bytes.
constexpr uint64_t kRecordSize = 56;
constexpr const char* kRebuild =
    "rebuild the cache with DeepSpec's target-cache tool, or run with --skip-bad-samples";
constexpr const char* kRebuildIndex =
    "the cache is incomplete or damaged: rebuild it with DeepSpec's target-cache tool";

// One samples.idx record (byte offsets are within the shard file).
struct Record {
  uint32_t shard = 0;
  uint32_t seq_len = 0;
  uint64_t input_ids = 0, attention_mask = 0, loss_mask = 0, hidden = 0, last_hidden = 0;
};

uint64_t le_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little-endian on any host
  return v;
}
uint32_t le_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// An open shard read with pread, not mmap: a failing disk or a shard truncated under us turns a
// mapped read into SIGBUS, which kills the trainer; pread reports it, so the loader can retry
// (SampleReadError) or skip the sample.
class ShardFile {
 public:
  ShardFile(std::string path, const std::string& where) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) failure(where, "cannot open", errno);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);  // the destructor does not run for a constructor that throws
      failure(where, "fstat failed", err);
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~ShardFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  uint64_t size() const { return size_; }

  // Bytes [offset, offset + n) into `out`; the caller has checked the range against size().
  void read(uint64_t offset, uint64_t n, void* out, const std::string& where) const {
    char* dst = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) failure(where, "read failed", errno);
      if (got == 0)
        throw BadSampleError(
            str(where, ": shard ends at byte ", offset, " although the index says it holds ", n,
                " more bytes there (the shard was truncated after the cache was opened)"),
            kRebuild, __FILE__, __LINE__);
      dst += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<uint64_t>(got);
    }
  }

 private:
  // A missing shard or a permission problem does not go away; other errors (EIO, a stale NFS
  // handle) may, so they are SampleReadError, which the loader retries.
  [[noreturn]] void failure(const std::string& where, const char* what, int err) const {
    const std::string msg = str(where, ": ", what, " (", std::strerror(err), ")");
    if (err == ENOENT || err == EACCES || err == EISDIR || err == ENOTDIR)
      throw BadSampleError(msg, "check the cache directory and its permissions", __FILE__,
                           __LINE__);
    throw SampleReadError(msg, "check the file system", __FILE__, __LINE__);
  }

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

json read_manifest(const fs::path& p) {
  std::ifstream in(p);
  FSDP_USAGE_CHECK(in.good(), p.string() + ": cannot open", "check the path and its permissions");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    FSDP_USAGE_FAIL(p.string() + ": not valid JSON (" + e.what() + ")", kRebuildIndex);
  }
}

class DeepSpecDataset final : public FeatureDataset {
 public:
  DeepSpecDataset(const std::string& dir, DatasetOptions options) : root_(dir), options_(options) {
    read_manifest_fields();
    read_index();
  }

  std::string format() const override { return "deepspec"; }
  int64_t size() const override { return static_cast<int64_t>(records_.size()); }
  const std::string& root() const override { return root_; }
  std::vector<int64_t> captured_layer_ids() const override { return layer_ids_; }

  std::string source(int64_t i) const override {
    return str(shards_.at(records_.at(i).shard), " (sample ", i, ")");
  }
  std::string source_key(int64_t i) const override {
    return str(fs::path(shards_.at(records_.at(i).shard)).filename().string(), "[", i, "]");
  }
  uint64_t source_bytes(int64_t i) const override {
    const Record& r = records_.at(i);
    uint64_t n = 0;
    return lengths(r, &n) ? n : 0;
  }

  RawSample read(int64_t i) const override {
    const Record& r = checked(i);
    const std::string where = source(i);
    const auto file = shard(r.shard, where);
    check_ranges(r, *file, where);
    const int64_t s = r.seq_len, h = hidden_size_, l = static_cast<int64_t>(layer_ids_.size());
    at::Tensor ids = read_tensor(*file, r.input_ids, {s}, at::kInt, where);
    at::Tensor mask = read_tensor(*file, r.loss_mask, {s}, at::kByte, where);
    at::Tensor aux = read_tensor(*file, r.hidden, {s, l * h}, at::kBFloat16, where);
    // The last state stays on disk when the algorithm has no use for it (DFlash).
    at::Tensor last = options_.last_hidden == DatasetOptions::LastHidden::kUnused
                          ? at::Tensor()
                          : read_tensor(*file, r.last_hidden, {s, h}, at::kBFloat16, where);
    return validate_sample(ids, mask, last, aux, where, options_);
  }

  TokenSample read_tokens(int64_t i) const override {
    // The whole sample is read and checked, so a sample training would skip is not counted.
    RawSample s = read(i);
    return {s.input_ids, s.loss_mask};
  }

  TokenSample read_tokens_only(int64_t i) const override {
    const Record& r = checked(i);
    const std::string where = source(i);
    const auto file = shard(r.shard, where);
    check_ranges(r, *file, where);
    const int64_t s = r.seq_len;
    at::Tensor ids = read_tensor(*file, r.input_ids, {s}, at::kInt, where);
    at::Tensor mask = read_tensor(*file, r.loss_mask, {s}, at::kByte, where);
    return validate_tokens_only(ids, mask, where, options_);
  }

 private:
  void read_manifest_fields() {
    const fs::path mp = fs::path(root_) / kManifestFile;
    const json j = read_manifest(mp);
    const std::string where = mp.string();
    auto need = [&](bool ok, const std::string& what) {
      FSDP_USAGE_CHECK(ok, where + ": " + what, kRebuildIndex);
    };
    need(j.is_object(), "not a JSON object");
    auto integer = [&](const char* key) {
      need(j.contains(key) && j[key].is_number_integer(),
           str("missing or non-integer field '", key, "'"));
      return j[key].get<int64_t>();
    };
    auto text = [&](const char* key, const char* expected) {
      need(j.contains(key) && j[key].is_string(), str("missing or non-string field '", key, "'"));
      const std::string v = j[key].get<std::string>();
      need(v == expected, str(key, " is '", v, "', expected '", expected, "'"));
    };
    const int64_t version = integer("version");
    FSDP_USAGE_CHECK(version == kManifestVersion,
                     str(where, ": DeepSpec cache version ", version,
                         " is not supported (expected ", kManifestVersion, ")"),
                     "rebuild the cache with a DeepSpec release that writes version 2");
    num_samples_ = integer("num_samples");
    need(num_samples_ >= 0, str("num_samples is ", num_samples_));
    const int64_t num_shards = integer("num_shards");
    need(num_shards >= 0, str("num_shards is ", num_shards));
    hidden_size_ = integer("hidden_size");
    need(hidden_size_ > 0, str("hidden_size is ", hidden_size_));
    const int64_t record_size = integer("index_record_size");
    need(record_size == static_cast<int64_t>(kRecordSize),
         str("index_record_size is ", record_size, ", expected ", kRecordSize));
    text("hidden_dtype", "bfloat16");
    text("token_dtype", "int32");
    text("mask_dtype", "uint8");

    need(j.contains("target_layer_ids") && j["target_layer_ids"].is_array() &&
             !j["target_layer_ids"].empty(),
         "missing or empty field 'target_layer_ids'");
    for (const auto& v : j["target_layer_ids"]) {
      need(v.is_number_integer() && v.get<int64_t>() >= 0,
           "target_layer_ids holds a value that is not a layer id (an integer >= 0)");
      layer_ids_.push_back(v.get<int64_t>());
    }
    need(std::is_sorted(layer_ids_.begin(), layer_ids_.end()),
         "target_layer_ids is not sorted ascending");

    need(j.contains("shards") && j["shards"].is_array(), "missing field 'shards' (a list)");
    need(static_cast<int64_t>(j["shards"].size()) == num_shards,
         str("shards lists ", j["shards"].size(), " shards but num_shards is ", num_shards));
    for (const auto& s : j["shards"]) {
      const int64_t k = static_cast<int64_t>(shards_.size());
      need(s.is_object() && s.contains("shard_id") && s["shard_id"].is_number_integer() &&
               s["shard_id"].get<int64_t>() == k,
           str("shards[", k, "] must have shard_id ", k, " (shard ids run from 0, in order)"));
      need(s.contains("file_name") && s["file_name"].is_string(),
           str("shards[", k, "] has no file_name"));
      const std::string name = s["file_name"].get<std::string>();
      // A bare name: the manifest must not point the reader outside the cache directory.
      need(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos,
           str("shards[", k, "] file_name '", name, "' is not a file name in the cache directory"));
      shards_.push_back((fs::path(root_) / name).string());
    }

    // Both are known before any shard is read, so a mismatch fails at start-up, not per sample.
    const int64_t n_layers = static_cast<int64_t>(layer_ids_.size());
    if (options_.num_aux_layers > 0 && n_layers != options_.num_aux_layers)
      FSDP_USAGE_FAIL(
          str(where, ": the cache holds ", n_layers, " captured layers (", layer_list(),
              "), the draft reads ", options_.num_aux_layers, " (", options_.layers_key, ")"),
          str("capture the layers the draft config names (", options_.layers_key,
              "), or use features dumped for this draft"));
    if (options_.hidden_size > 0 && hidden_size_ != options_.hidden_size)
      FSDP_USAGE_CHECK(
          false,
          str(where, ": hidden size ", hidden_size_, " but the target has ", options_.hidden_size),
          "use a cache built from the same target model as --target-model-path");
  }

  std::string layer_list() const {
    std::string out = "layer ids";
    for (size_t k = 0; k < layer_ids_.size(); ++k) out += str(k ? ", " : " ", layer_ids_[k]);
    return out;
  }

  void read_index() {
    const std::string where = (fs::path(root_) / kIndexFile).string();
    std::error_code ec;
    const uint64_t bytes = fs::file_size(where, ec);
    FSDP_USAGE_CHECK(!ec, str(where, ": cannot read its size (", ec.message(), ")"),
                     "check the path and its permissions");
    // Checked before reading: the size is known from the manifest, and a truncated index would
    // otherwise silently drop samples.
    const uint64_t expected = static_cast<uint64_t>(num_samples_) * kRecordSize;
    FSDP_USAGE_CHECK(
        bytes / kRecordSize == static_cast<uint64_t>(num_samples_) && bytes == expected,
        str(where, ": ", bytes, " bytes, but num_samples ", num_samples_, " x ", kRecordSize,
            "-byte records is ", expected),
        kRebuildIndex);
    std::vector<unsigned char> raw(bytes);
    std::ifstream in(where, std::ios::binary);
    FSDP_USAGE_CHECK(in.good(), where + ": cannot open", "check the path and its permissions");
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(bytes));
    FSDP_USAGE_CHECK(in.gcount() == static_cast<std::streamsize>(bytes),
                     str(where, ": read only ", in.gcount(), " of ", bytes, " bytes"),
                     "check the file system");
    records_.reserve(static_cast<size_t>(num_samples_));
    for (int64_t i = 0; i < num_samples_; ++i) {
      const unsigned char* p = raw.data() + static_cast<uint64_t>(i) * kRecordSize;
      const uint64_t id = le_u64(p);
      FSDP_USAGE_CHECK(id == static_cast<uint64_t>(i),
                       str(where, ": record ", i, " holds sample_id ", id,
                           " (records must be dense and in order: record i is sample i)"),
                       kRebuildIndex);
      Record r;
      r.shard = le_u32(p + 8);
      r.seq_len = le_u32(p + 12);
      r.input_ids = le_u64(p + 16);
      r.attention_mask = le_u64(p + 24);
      r.loss_mask = le_u64(p + 32);
      r.hidden = le_u64(p + 40);
      r.last_hidden = le_u64(p + 48);
      FSDP_USAGE_CHECK(r.shard < shards_.size(),
                       str(where, ": sample ", i, " names shard_id ", r.shard,
                           " but the manifest "
                           "lists ",
                           shards_.size(), " shards"),
                       kRebuildIndex);
      records_.push_back(r);
    }
  }

  // The byte length of each of the record's five tensors; false when one overflows 64 bits.
  bool lengths(const Record& r, uint64_t* total, uint64_t out[5] = nullptr) const {
    const uint64_t s = r.seq_len, h = static_cast<uint64_t>(hidden_size_);
    const uint64_t l = layer_ids_.size();
    uint64_t lens[5] = {0, s, s, 0, 0};
    if (__builtin_mul_overflow(s, 4, &lens[0])) return false;
    uint64_t sh = 0;
    if (__builtin_mul_overflow(s, h, &sh) || __builtin_mul_overflow(sh, 2, &lens[4]) ||
        __builtin_mul_overflow(lens[4], l, &lens[3]))
      return false;
    uint64_t sum = 0;
    for (uint64_t x : lens)
      if (__builtin_add_overflow(sum, x, &sum)) return false;
    *total = sum;
    if (out) std::copy(lens, lens + 5, out);
    return true;
  }

  // Every tensor of the record inside the shard (overflow-safe), and a non-empty sample. The
  // attention mask is only range-checked, never read: DeepSpec cuts each sample to its length, so
  // it is all ones by construction, and DeepSpec's own reader ignores it too.
  void check_ranges(const Record& r, const ShardFile& file, const std::string& where) const {
    if (r.seq_len == 0)
      throw BadSampleError(where + ": seq_len is 0", kRebuild, __FILE__, __LINE__);
    uint64_t total = 0, lens[5];
    if (!lengths(r, &total, lens))
      throw BadSampleError(str(where, ": seq_len ", r.seq_len, " x hidden size ", hidden_size_,
                               " overflows 64 bits"),
                           kRebuild, __FILE__, __LINE__);
    const char* names[5] = {"input_ids", "attention_mask", "loss_mask", "target_hidden_states",
                            "target_last_hidden_states"};
    const uint64_t offsets[5] = {r.input_ids, r.attention_mask, r.loss_mask, r.hidden,
                                 r.last_hidden};
    const uint64_t size = file.size();
    for (int k = 0; k < 5; ++k) {
      if (offsets[k] > size || lens[k] > size - offsets[k])
        throw BadSampleError(
            str(where, ": ", names[k], " at byte ", offsets[k], " (", lens[k],
                " bytes for seq_len ", r.seq_len, ") runs past the end of the shard (", size,
                " bytes)"),
            "the shard is truncated or does not match samples.idx: rebuild the cache with "
            "DeepSpec's target-cache tool, or run with --skip-bad-samples",
            __FILE__, __LINE__);
    }
  }

  // The bytes go into a fresh tensor with one copy: offsets can be odd (no alignment padding),
  // so the shard's bytes could not be viewed in place anyway.
  at::Tensor read_tensor(const ShardFile& file, uint64_t offset, std::vector<int64_t> shape,
                         at::ScalarType dtype, const std::string& where) const {
    at::Tensor t = at::empty(shape, dtype);
    file.read(offset, t.nbytes(), t.data_ptr(), where);
    bytes_read_ += t.nbytes();
    return t;
  }

  const Record& checked(int64_t i) const {
    FSDP_CHECK(i >= 0 && i < size(), str("sample index ", i, " out of range [0, ", size(), ")"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    return records_[static_cast<size_t>(i)];
  }

  // Small LRU of open shards: a descriptor per shard of a multi-TB cache would exceed the
  // open-file limit, and samples are mostly read in runs from one shard.
  std::shared_ptr<ShardFile> shard(uint32_t k, const std::string& where) const {
    return open_.get(
        k, [&] { return std::make_shared<ShardFile>(shards_[k], where); }, files_opened_);
  }

  std::string root_;
  DatasetOptions options_;
  int64_t num_samples_ = 0;
  int64_t hidden_size_ = 0;
  std::vector<int64_t> layer_ids_;
  std::vector<std::string> shards_;
  std::vector<Record> records_;
  OpenShardCache<uint32_t, ShardFile> open_;
};

}  // namespace

bool is_deepspec_cache(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifestFile, ec) &&
         fs::exists(fs::path(dir) / kIndexFile, ec);
}

std::shared_ptr<FeatureDataset> open_deepspec_dataset(const std::string& dir,
                                                      const DatasetOptions& options) {
  return std::make_shared<DeepSpecDataset>(dir, options);
}

FeatureFormat deepspec_feature_format() {
  return {"deepspec", "manifest.json", FormatDetection::kDirectory,
          [](const std::string& path) -> FeatureOpener {
            if (!is_deepspec_cache(path)) return {};
            return [path](const DatasetOptions& o) { return open_deepspec_dataset(path, o); };
          }};
}

}  // namespace fsdp::data
