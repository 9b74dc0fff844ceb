// .ckpt tree listing, the .ckpt dataset and format detection (dataset.h).
#include "data/dataset.h"

#include <algorithm>
#include <filesystem>

#include "data/native_format.h"

namespace fsdp::data {

namespace fs = std::filesystem;

std::vector<std::string> list_ckpt_files(const std::string& dir) {
  FSDP_USAGE_CHECK(fs::is_directory(dir), dir + ": hidden-states directory does not exist",
                   "check --train-hidden-states-path / --input");
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(
           dir, fs::directory_options::follow_directory_symlink, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    FSDP_USAGE_CHECK(!ec, dir + ": cannot list (" + ec.message() + ")",
                     "check permissions and symbolic links (a link to a parent loops)");
    if (it->path().extension() != ".ckpt") continue;
    // A link whose target is gone is listed too: it is a missing sample (an error, or skipped
    // and counted with --skip-bad-samples), never silently fewer samples.
    std::error_code fe;
    const bool regular = it->is_regular_file(fe);
    if (regular || (it->is_symlink(fe) && !fs::exists(it->path(), fe))) {
      files.push_back(it->path().string());
    }
  }
  FSDP_USAGE_CHECK(!ec, dir + ": cannot list (" + ec.message() + ")",
                   "check permissions and symbolic links (a link to a parent loops)");
  // Byte-wise sort of full paths: reproducible on every file system (SpecForge walks unsorted).
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

class CkptDataset final : public FeatureDataset {
 public:
  CkptDataset(std::string root, std::vector<std::string> files, DatasetOptions options)
      : root_(std::move(root)), files_(std::move(files)), options_(options) {}
  std::string format() const override { return "ckpt"; }
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  RawSample read(int64_t i) const override { return read_ckpt_sample(open_file(i), options_); }
  TokenSample read_tokens(int64_t i) const override {
    RawSample s = read(i);
    return {s.input_ids, s.loss_mask};
  }
  TokenSample read_tokens_only(int64_t i) const override {
    return read_ckpt_tokens(open_file(i), options_);
  }
  std::string source(int64_t i) const override { return files_.at(i); }
  const std::string& root() const override { return root_; }

 private:
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

}  // namespace

std::shared_ptr<FeatureDataset> open_feature_dataset(const std::string& path,
                                                     const DatasetOptions& options) {
  FSDP_USAGE_CHECK(fs::exists(path), path + ": hidden-states path does not exist",
                   "check --train-hidden-states-path");
  if (is_native_dataset(path)) return open_native_dataset(path, options);
  auto files = list_ckpt_files(path);
  FSDP_USAGE_CHECK(!files.empty(),
                   path + ": no *.ckpt files and no " + std::string(kNativeIndexFile) + " found",
                   "point the path at SpecForge hidden states (rows_*/data_*.ckpt) or at the "
                   "output of `fsdp-train convert`");
  return std::make_shared<CkptDataset>(path, std::move(files), options);
}

}  // namespace fsdp::data
