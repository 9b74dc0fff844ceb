// safetensors files: header parsing, validated reads of selected tensors through mmap, and an
// atomic writer. Used for native feature shards, for reading only the embedding and LM head out
// of a (possibly hundreds of GB) target checkpoint, and for model exports. Never reads bytes of
// tensors nobody asked for, and never trusts a header before checking it against the file size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::checkpoint {

// One entry of a safetensors header. Offsets are absolute byte positions in the file (the
// header's data_offsets are relative to the end of the header; we add that base once).
struct TensorInfo {
  std::string name;
  // Undefined for dtypes LibTorch cannot hold (e.g. F8_E5M2): such
  // tensors are range-checked at open but only rejected when someone reads them.
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::string dtype_str;  // as written in the header ("BF16", ...)
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // absolute file offset of the first byte
  uint64_t end = 0;    // absolute file offset one past the last byte
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// A read-only, memory-mapped safetensors file. Opening parses and validates the whole header
// (length sane, JSON well formed, known dtypes, shapes consistent with byte ranges, ranges
// inside the file and not overlapping) but touches no tensor data; read() copies only the pages
// of the tensor asked for. Errors are fsdp::UsageError naming the file and the tensor.
// Thread-safe for concurrent reads.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // Tensors in file order (ascending offsets).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const;
  // Throws fsdp::UsageError naming the file when the tensor is missing.
  const TensorInfo& info(const std::string& name) const;
  // The "__metadata__" string map of the header (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A new CPU tensor holding a copy of the named tensor's bytes.
  at::Tensor read(const std::string& name) const;
  // Rows [from, from + count) of a tensor of shape [S, ...] or [1, S, ...] (clipped to S), as a
  // new CPU tensor [rows, ...] (the leading 1 dropped): copies only those rows' bytes.
  at::Tensor read_rows(const std::string& name, int64_t from, int64_t count) const;
  // Raw pointer into the mapping for [info.begin, info.end) (valid while this object lives).
  const uint8_t* data(const TensorInfo& info) const { return base_ + info.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  const uint8_t* base_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Parses a header given its raw JSON text; `file_size` bounds the data offsets and `where` names
// the input in errors. Exposed for tests of corrupt headers.
std::vector<TensorInfo> parse_safetensors_header(const std::string& json, uint64_t data_base,
                                                 uint64_t file_size, const std::string& where,
                                                 std::map<std::string, std::string>* metadata);

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes tensors (any device; copied to CPU contiguous) in the given order with the given
// metadata. Atomic: writes `path.tmp.<pid>`, fsyncs, renames over `path`, so readers never see
// a half-written file. Names must be unique and non-empty. Returns the bytes written.
uint64_t write_safetensors(const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// Reads named tensors out of a Hugging Face model directory: `model.safetensors`, or shards
// resolved through `model.safetensors.index.json` (weight_map), opening only the shard files
// that hold the requested names and copying only those tensors' bytes. Errors name the
// directory, file and tensor, and list similar names when one is missing.
std::map<std::string, at::Tensor> read_model_tensors(const std::string& model_dir,
                                                     const std::vector<std::string>& names);

// Which file of `model_dir` holds each tensor (the index's weight_map, or every tensor of the
// single model.safetensors). Does not open shard files when an index exists.
std::map<std::string, std::string> model_weight_map(const std::string& model_dir);

}  // namespace fsdp::checkpoint
