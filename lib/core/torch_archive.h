// torch.save archives read without LibTorch's reader: the zip container (core/zip_reader.h), the
// pickle (core/pickle_reader.h) and every tensor record checked against the bytes its storage
// really holds, before any tensor exists. TorchArchive is pure C++ (the fuzz targets build it);
// load_torch_archive (torch_archive_load.cpp) turns a checked archive into LibTorch values.
#pragma once

#include <string>
#include <vector>

#include "core/pickle_reader.h"
#include "core/zip_reader.h"

namespace fsdp {

struct ArchiveLimits {
  ZipLimits zip;
  PickleLimits pickle;
};

class TorchArchive {
 public:
  // Parses `bytes` (kept by reference) and checks: one <prefix>/data.pkl, a little-endian byte
  // order, the pickle within its limits, every storage's record present with exactly
  // numel x element-size bytes, every tensor's sizes, strides and offset inside its storage
  // (overflow-safe). Throws FormatError saying what is wrong.
  explicit TorchArchive(const std::vector<char>& bytes, const ArchiveLimits& limits = {});
  // Same over a source (kept by reference): reads the directory, byteorder and data.pkl records
  // only; storages are read when a caller reads their entries (load_torch_archive_keys).
  explicit TorchArchive(const ZipSource& source, const ArchiveLimits& limits = {});

  const PickleTree& tree() const { return tree_; }
  const ZipArchive& zip() const { return zip_; }
  // The record holding a kStorage node's bytes.
  const ZipEntry& storage_entry(const PickleNode& storage) const;

 private:
  void check(const ArchiveLimits& limits);

  ZipArchive zip_;
  std::string prefix_;  // "archive/" for "archive/data.pkl"
  PickleTree tree_;
};

// Bounds a tensor's view of its storage: sizes and strides >= 0, offset >= 0, and, unless the
// tensor is empty, offset + sum((size_i - 1) * stride_i) < storage_numel, all without overflow.
// "" when it fits, else the problem.
std::string tensor_view_problem(int64_t offset, const std::vector<int64_t>& sizes,
                                const std::vector<int64_t>& strides, int64_t storage_numel);

}  // namespace fsdp
