// Parts shared by the feature readers (dataset.h): the dataset whose sample i is file i (SpecForge
// .ckpt trees, ModelOpt dumps), and the small cache of open shard files (native shards, DeepSpec
// shards). Header-only.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"

namespace fsdp::data {

// Sample i is files[i]; the source key is the path relative to the root and the source size the
// file's size.
class FileListDataset : public FeatureDataset {
 public:
  FileListDataset(std::string root, std::vector<std::string> files, DatasetOptions options)
      : root_(std::move(root)), files_(std::move(files)), options_(options) {}
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  const std::string& root() const override { return root_; }
  std::string source(int64_t i) const override { return files_.at(i); }
  std::string source_key(int64_t i) const override {
    return std::filesystem::relative(files_.at(i), root_).string();
  }
  uint64_t source_bytes(int64_t i) const override {
    std::error_code ec;
    const auto n = std::filesystem::file_size(files_.at(i), ec);
    return ec ? 0 : n;
  }

 protected:
  // The file of sample i, counted as opened.
  const std::string& open_file(int64_t i) const {
    FSDP_CHECK(i >= 0 && i < size(), str("sample index ", i, " out of range [0, ", size(), ")"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    ++files_opened_;
    return files_[i];
  }

  std::string root_;
  std::vector<std::string> files_;
  DatasetOptions options_;
};

// The most recently used open shards (at most `capacity`): opening is cheap, but keeping every
// shard of a multi-TB dataset open would make resident memory look huge as pages are touched.
// Thread-safe.
template <typename Key, typename File>
class OpenShardCache {
 public:
  explicit OpenShardCache(size_t capacity = 8) : capacity_(capacity) {}
  // The open file of shard `k`, opened with `open` (and counted in `opened`) when not cached.
  std::shared_ptr<File> get(const Key& k, const std::function<std::shared_ptr<File>()>& open,
                            std::atomic<int64_t>& opened) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      if (it->first == k) {
        open_.splice(open_.begin(), open_, it);
        return open_.front().second;
      }
    }
    auto f = open();
    ++opened;
    open_.emplace_front(k, f);
    if (open_.size() > capacity_) open_.pop_back();
    return f;
  }

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  mutable std::list<std::pair<Key, std::shared_ptr<File>>> open_;
};

}  // namespace fsdp::data
