// .ckpt tree listing, the .ckpt dataset and format detection (dataset.h).
#include "data/dataset.h"

#include <algorithm>
#include <filesystem>

#include "data/dataset_parts.h"
#include "data/formats.h"
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

RawSample FeatureDataset::read_rows(int64_t i, int64_t from, int64_t count) const {
  RawSample s = read(i);
  const int64_t S = s.hidden_state.size(0);
  const int64_t begin = std::clamp<int64_t>(from, 0, S);
  const int64_t end = std::clamp<int64_t>(from + std::max<int64_t>(count, 0), begin, S);
  // Copies: the rows outside the window are released with the whole tensors.
  s.hidden_state = s.hidden_state.narrow(0, begin, end - begin).clone();
  s.aux_hidden_state = s.aux_hidden_state.narrow(0, begin, end - begin).clone();
  s.row_offset = begin;
  return s;
}

std::shared_ptr<FeatureDataset> open_feature_dataset(const std::string& path,
                                                     const DatasetOptions& options) {
  FSDP_USAGE_CHECK(fs::exists(path), path + ": hidden-states path does not exist",
                   "check --train-hidden-states-path");
  if (is_native_dataset(path)) return open_native_dataset(path, options);
  if (auto ds = open_producer_dataset(path, options)) return ds;
  auto files = list_ckpt_files(path);
  FSDP_USAGE_CHECK(!files.empty(),
                   path +
                       ": no feature files found (no *.ckpt, *.ckpt.gz, hs_<i>.safetensors, "
                       "*.pt, manifest.json or " +
                       std::string(kNativeIndexFile) + ")",
                   "point the path at SpecForge hidden states (rows_*/data_*.ckpt[.gz]), another "
                   "producer's dump (docs/data.md) or the output of `fsdp-train convert`");
  return std::make_shared<CkptDataset>(path, std::move(files), options);
}

}  // namespace fsdp::data
