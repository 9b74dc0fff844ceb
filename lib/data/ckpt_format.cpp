// SpecForge .ckpt / .ckpt.gz trees (dataset.h): the recursive listing, the dataset whose sample i
// is the i-th file in byte order, and its registry entry (formats.h). Opening lists files but
// never opens one.
#include <algorithm>
#include <filesystem>

#include "data/dataset_parts.h"
#include "data/formats.h"

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
    const std::string name = it->path().filename().string();
    const bool gz = name.size() > 8 && name.compare(name.size() - 8, 8, ".ckpt.gz") == 0;
    if (it->path().extension() != ".ckpt" && !gz) continue;
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

class CkptDataset final : public FileListDataset {
 public:
  using FileListDataset::FileListDataset;
  std::string format() const override { return "ckpt"; }
  RawSample read(int64_t i) const override {
    uint64_t n = 0;
    RawSample s = read_ckpt_sample(open_file(i), options_, &n);
    bytes_read_ += n;
    return s;
  }
  TokenSample read_tokens(int64_t i) const override {
    RawSample s = read(i);
    return {s.input_ids, s.loss_mask};
  }
  TokenSample read_tokens_only(int64_t i) const override {
    uint64_t n = 0;
    TokenSample s = read_ckpt_tokens(open_file(i), options_, &n);
    bytes_read_ += n;
    return s;
  }
};

}  // namespace

std::shared_ptr<FeatureDataset> open_ckpt_dataset(const std::string& root,
                                                  std::vector<std::string> files,
                                                  const DatasetOptions& options) {
  return std::make_shared<CkptDataset>(root, std::move(files), options);
}

FeatureFormat ckpt_feature_format() {
  return {"ckpt", "*.ckpt, *.ckpt.gz", FormatDetection::kTree,
          [](const std::string& path) -> FeatureOpener {
            auto files = list_ckpt_files(path);
            if (files.empty()) return {};
            // Opened once: the listing moves into the dataset.
            return [path, files = std::move(files)](const DatasetOptions& o) mutable {
              return open_ckpt_dataset(path, std::move(files), o);
            };
          }};
}

}  // namespace fsdp::data
