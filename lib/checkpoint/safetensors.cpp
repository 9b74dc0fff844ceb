// safetensors reading (mmap, validated header) and atomic writing (safetensors.h).
// Format: 8-byte little-endian header length N, N bytes of JSON, then the tensor bytes.
#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint_dir.h"
#include "core/dtype.h"
#include "core/error.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Headers of real checkpoints are a few MB at most; 100 MB is the safetensors library's limit.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Element sizes of every dtype string the format defines, including ones LibTorch lacks here.
int64_t element_size(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

c10::ScalarType torch_dtype_or_undefined(const std::string& d) {
  static const std::set<std::string> known = {"F64", "F32", "F16", "BF16", "I64",    "I32",
                                              "I16", "I8",  "U8",  "BOOL", "F8_E4M3"};
  return known.count(d) ? dtype_from_safetensors(d) : c10::ScalarType::Undefined;
}

[[noreturn]] void bad_file(const std::string& where, const std::string& what) {
  throw_usage_error(__FILE__, __LINE__, where + ": " + what,
                    "the file is truncated or not a safetensors file; re-create or re-download it");
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorInfo> parse_safetensors_header(const std::string& text, uint64_t data_base,
                                                 uint64_t file_size, const std::string& where,
                                                 std::map<std::string, std::string>* metadata) {
  json h;
  try {
    h = json::parse(text);
  } catch (const json::exception& e) {
    bad_file(where, str("header is not valid JSON (", e.what(), ")"));
  }
  if (!h.is_object()) bad_file(where, "header is not a JSON object");
  std::vector<TensorInfo> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad_file(where, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          bad_file(where, "__metadata__ value '" + m.key() + "' is not a string");
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string t = "tensor '" + name + "'";
    if (name.empty()) bad_file(where, "empty tensor name in header");
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      bad_file(where, t + ": entry needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) bad_file(where, t + ": dtype is not a string");
    TensorInfo info;
    info.name = name;
    info.dtype_str = v["dtype"].get<std::string>();
    const int64_t esize = element_size(info.dtype_str);
    if (esize == 0) bad_file(where, t + ": unknown dtype '" + info.dtype_str + "'");
    info.dtype = torch_dtype_or_undefined(info.dtype_str);
    if (!v["shape"].is_array()) bad_file(where, t + ": shape is not a list");
    // Overflow-safe product: each dim and the running product stay below 2^62.
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad_file(where, t + ": shape has a non-integer or negative dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t{1} << 62) / dim) bad_file(where, t + ": shape too large");
      numel *= dim;
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad_file(where, t + ": data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (e < b) bad_file(where, t + ": data_offsets end before they begin");
    if (numel * static_cast<uint64_t>(esize) != e - b)
      bad_file(where, str(t, ": ", e - b, " bytes do not match dtype ", info.dtype_str,
                          " and shape (", numel, " elements of ", esize, " bytes)"));
    if (data_base + e > file_size)
      bad_file(where, str(t, ": data ends at byte ", data_base + e, " but the file has ", file_size,
                          " bytes (truncated?)"));
    info.begin = data_base + b;
    info.end = data_base + e;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].begin < out[i - 1].end)
      bad_file(where, "tensors '" + out[i - 1].name + "' and '" + out[i].name + "' overlap");
  }
  return out;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_USAGE_CHECK(f->fd_ >= 0, str(path, ": cannot open (", std::strerror(errno), ")"),
                   "check the path and permissions");
  struct stat st {};
  FSDP_CHECK(::fstat(f->fd_, &st) == 0, str(path, ": fstat failed: ", std::strerror(errno)),
             "check that the file is readable and its filesystem is mounted and healthy");
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8)
    bad_file(path, str("only ", f->size_, " bytes, shorter than the 8-byte header length"));
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, f->fd_, 0);
  FSDP_CHECK(p != MAP_FAILED, str(path, ": mmap failed: ", std::strerror(errno)),
             "check free address space and that the file system supports mmap");
  f->base_ = static_cast<const uint8_t*>(p);
  // The mapping stays valid without the descriptor; closing it keeps thousands of mapped shards
  // within the open-file limit.
  ::close(f->fd_);
  f->fd_ = -1;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f->base_[i];  // little-endian on any host
  if (n == 0 || n > kMaxHeaderBytes || n > f->size_ - 8)
    bad_file(path,
             str("header length ", n, " is not plausible for a file of ", f->size_, " bytes"));
  std::string text(reinterpret_cast<const char*>(f->base_ + 8), n);
  f->tensors_ = parse_safetensors_header(text, 8 + n, f->size_, path, &f->metadata_);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_[f->tensors_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return by_name_.count(name) > 0;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = by_name_.find(name);
  FSDP_USAGE_CHECK(it != by_name_.end(), path_ + ": no tensor named '" + name + "'",
                   str("the file holds ", tensors_.size(), " tensors",
                       tensors_.empty() ? "" : ", e.g. '" + tensors_.front().name + "'"));
  return tensors_[it->second];
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const TensorInfo& ti = info(name);
  FSDP_USAGE_CHECK(ti.dtype != c10::ScalarType::Undefined,
                   path_ + ": tensor '" + name + "' has dtype " + ti.dtype_str +
                       ", which this build cannot load",
                   "convert the tensor to BF16/F16/F32");
  at::Tensor t = at::empty(ti.shape, at::TensorOptions().dtype(ti.dtype));
  if (ti.nbytes() > 0) std::memcpy(t.data_ptr(), base_ + ti.begin, ti.nbytes());
  return t;
}

at::Tensor SafetensorsFile::read_rows(const std::string& name, int64_t from, int64_t count) const {
  const TensorInfo& ti = info(name);
  FSDP_USAGE_CHECK(ti.dtype != c10::ScalarType::Undefined,
                   path_ + ": tensor '" + name + "' has dtype " + ti.dtype_str +
                       ", which this build cannot load",
                   "convert the tensor to BF16/F16/F32");
  std::vector<int64_t> shape = ti.shape;
  if (shape.size() == 3 && shape[0] == 1) shape.erase(shape.begin());
  FSDP_USAGE_CHECK(!shape.empty() && from >= 0 && count >= 0,
                   str(path_, ": tensor '", name, "' has no rows to read (shape of ",
                       ti.shape.size(), " dims), or rows [", from, ", +", count, ") asked"),
                   "the shard does not match the index; convert again");
  const int64_t S = shape[0];
  const int64_t begin = std::min(from, S), end = std::min(from + count, S);
  uint64_t row_bytes = static_cast<uint64_t>(c10::elementSize(ti.dtype));
  for (size_t d = 1; d < shape.size(); ++d) row_bytes *= static_cast<uint64_t>(shape[d]);
  shape[0] = end - begin;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(ti.dtype));
  const uint64_t n = row_bytes * static_cast<uint64_t>(end - begin);
  if (n > 0)
    std::memcpy(t.data_ptr(), base_ + ti.begin + row_bytes * static_cast<uint64_t>(begin), n);
  return t;
}

uint64_t write_safetensors(const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h;
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::vector<at::Tensor> cpu;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    FSDP_CHECK(!name.empty() && name != "__metadata__",
               path + ": invalid tensor name '" + name + "'",
               "this is a bug in fsdp-train: please report it with the command line and log");
    FSDP_CHECK(seen.insert(name).second, path + ": tensor '" + name + "' given twice",
               "this is a bug in fsdp-train: please report it with the command line and log");
    FSDP_CHECK(t.defined(), path + ": tensor '" + name + "' is undefined",
               "this is a bug in fsdp-train: please report it with the command line and log");
    at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
    const uint64_t nb = c.numel() * c.element_size();
    nlohmann::ordered_json e;
    e["dtype"] = dtype_to_safetensors(c.scalar_type());
    e["shape"] = c.sizes().vec();
    e["data_offsets"] = {offset, offset + nb};
    h[name] = e;
    offset += nb;
    cpu.push_back(std::move(c));
  }
  std::string text = h.dump();
  // Pad with spaces so tensor data starts 8-byte aligned (what the reference writer does).
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  const uint64_t n = text.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));

  const std::string tmp = str(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FSDP_CHECK(out.good(), str(tmp, ": cannot create (", std::strerror(errno), ")"),
               "check that the directory exists and is writable");
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(n));
    for (const auto& c : cpu)
      out.write(static_cast<const char*>(c.data_ptr()),
                static_cast<std::streamsize>(c.numel() * c.element_size()));
    out.flush();
    FSDP_CHECK(out.good(), str(tmp, ": write failed (", std::strerror(errno), ")"),
               "check free disk space");
  }
  // fsync before rename so a crash never leaves a complete-looking name over missing bytes.
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0 && ::fsync(fd) == 0, str(tmp, ": fsync failed (", std::strerror(errno), ")"),
             "check free disk space and write permissions of the output directory");
  ::close(fd);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  FSDP_CHECK(!ec, str("cannot rename ", tmp, " to ", path, ": ", ec.message()),
             "check free disk space and write permissions of the output directory");
  return 8 + n + offset;
}

std::map<std::string, std::string> model_weight_map(const std::string& model_dir) {
  const fs::path dir(model_dir);
  FSDP_USAGE_CHECK(fs::is_directory(dir), model_dir + ": not a directory",
                   "pass the Hugging Face model directory (with config.json and *.safetensors)");
  std::map<std::string, std::string> map;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      FSDP_USAGE_FAIL(index.string() + ": not valid JSON (" + e.what() + ")",
                      "re-download the index file");
    }
    FSDP_USAGE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                     index.string() + ": has no weight_map object", "re-download the index file");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      FSDP_USAGE_CHECK(it.value().is_string(),
                       index.string() + ": weight_map['" + it.key() + "'] is not a file name",
                       "re-download the index file (weight_map values must be file names)");
      map[it.key()] = (dir / it.value().get<std::string>()).string();
    }
    return map;
  }
  const fs::path single = dir / layout::kModel;
  const bool pickled =
      fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json");
  // "dir/" and "dir" name the same model; the converted copy goes next to it, not inside.
  std::string plain = dir.lexically_normal().string();
  while (plain.size() > 1 && plain.back() == '/') plain.pop_back();
  FSDP_USAGE_CHECK(
      fs::exists(single),
      model_dir + ": neither model.safetensors nor model.safetensors.index.json found" +
          (pickled ? " (it holds pytorch_model*.bin: pickled weights, which are not read)" : ""),
      pickled ? "convert it once: python -c \"from transformers import AutoModelForCausalLM as M; "
                "M.from_pretrained('" +
                    plain + "', torch_dtype='auto').save_pretrained('" + plain +
                    "-safetensors')\" (safetensors is the default format) and pass that directory"
              : "point --target-model-path at a Hugging Face checkpoint in safetensors format");
  auto f = SafetensorsFile::open(single.string());
  for (const auto& t : f->tensors()) map[t.name] = single.string();
  return map;
}

std::map<std::string, at::Tensor> read_model_tensors(const std::string& model_dir,
                                                     const std::vector<std::string>& names) {
  const auto map = model_weight_map(model_dir);
  std::map<std::string, std::shared_ptr<SafetensorsFile>> open_files;
  std::map<std::string, at::Tensor> out;
  for (const auto& name : names) {
    auto it = map.find(name);
    if (it == map.end()) {
      // Suggest names sharing the last component (e.g. "embed_tokens.weight" under a prefix).
      std::string tail = name;
      const size_t last = name.rfind('.');
      if (last != std::string::npos && last > 0) {
        const size_t prev = name.rfind('.', last - 1);
        if (prev != std::string::npos) tail = name.substr(prev + 1);
      }
      std::string similar;
      for (const auto& [k, v] : map)
        if (k.find(tail) != std::string::npos && similar.size() < 300) similar += " '" + k + "'";
      FSDP_USAGE_FAIL(model_dir + ": no tensor named '" + name + "' in the checkpoint",
                      similar.empty()
                          ? "set --embedding-key / --lm-head-key to a tensor name of the "
                            "checkpoint (tied embeddings: use the embedding name for both)"
                          : "similar names:" + similar);
    }
    auto& f = open_files[it->second];
    if (!f) f = SafetensorsFile::open(it->second);
    FSDP_USAGE_CHECK(f->contains(name),
                     it->second + ": index says it holds '" + name + "' but the file does not",
                     "the index and the shards disagree; re-download the checkpoint");
    out[name] = f->read(name);
  }
  return out;
}

}  // namespace fsdp::checkpoint
