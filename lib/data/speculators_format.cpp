// vLLM speculators' hidden-state dumps (formats.h): one hs_<i>.safetensors per row i of the
// preprocessed dataset, holding token_ids [S] and hidden_states [S, L, H] (bf16, or fp8 with one
// scale per token); the loss mask lives only in that dataset's Arrow files (save_to_disk), read
// one row at a time through data/arrow_ipc.h. Opening lists files and reads Arrow metadata only;
// never opens a safetensors file.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "data/arrow_ipc.h"
#include "data/formats.h"

namespace fsdp::data {

namespace fs = std::filesystem;
using checkpoint::SafetensorsFile;

namespace {

constexpr const char* kRegenerate =
    "regenerate this file with speculators' data generation, or run with --skip-bad-samples";

[[noreturn]] void bad(const std::string& where, const std::string& problem,
                      const std::string& hint = kRegenerate) {
  throw BadSampleError(where + ": " + problem, hint, __FILE__, __LINE__);
}

// The row index i of "hs_<i>.safetensors", or -1 for any other name.
int64_t hs_index(const std::string& name) {
  static const std::string prefix = "hs_", suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, 3, prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(3, name.size() - 3 - suffix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

fs::path normalized(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// One row's token columns of the preprocessed dataset: the Arrow files in state.json order.
class PreprocessedRows {
 public:
  explicit PreprocessedRows(const fs::path& dir) : dir_(dir.string()) {
    const fs::path state = dir / "state.json";
    const std::string hint =
        "point at the directory speculators' preprocessing saved with "
        "save_to_disk, unchanged";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::ifstream(state));
    } catch (const nlohmann::json::exception& e) {
      FSDP_USAGE_FAIL(fsdp::str(state.string(), ": not valid JSON (", e.what(), ")"), hint);
    }
    FSDP_USAGE_CHECK(j.is_object() && j.contains("_data_files") && j["_data_files"].is_array() &&
                         !j["_data_files"].empty(),
                     state.string() + ": no \"_data_files\" list", hint);
    for (const auto& entry : j["_data_files"]) {
      const std::string name =
          entry.is_object() && entry.contains("filename") && entry["filename"].is_string()
              ? entry["filename"].get<std::string>()
              : std::string();
      // Plain names only: the state file must not send the reader elsewhere on the disk.
      FSDP_USAGE_CHECK(
          !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
          fsdp::str(state.string(), ": bad _data_files entry ", entry.dump()), hint);
      files_.push_back(ArrowStreamFile::open((dir / name).string()));
      const auto& f = *files_.back();
      for (const char* column : {"input_ids", "loss_mask"})
        FSDP_USAGE_CHECK(
            f.find_column(column) >= 0,
            fsdp::str(f.where(), ": no '", column, "' column (it has ", columns(f), ")"),
            "speculators' preprocessing writes input_ids and loss_mask; point at its "
            "output, not at the raw chat dataset");
      first_row_.push_back(rows_);
      rows_ += f.num_rows();
    }
  }

  const std::string& dir() const { return dir_; }
  int64_t rows() const { return rows_; }

  // input_ids and loss_mask of `row` as int64 [S] tensors; `bytes` adds the bytes read.
  std::pair<at::Tensor, at::Tensor> tokens(int64_t row, uint64_t* bytes) const {
    const size_t k = static_cast<size_t>(
        std::upper_bound(first_row_.begin(), first_row_.end(), row) - first_row_.begin() - 1);
    const ArrowStreamFile& f = *files_[k];
    const int64_t r = row - first_row_[k];
    std::vector<int64_t> ids = f.int_list(f.find_column("input_ids"), r);
    std::vector<int64_t> mask = f.int_list(f.find_column("loss_mask"), r);
    *bytes += 8 * (ids.size() + mask.size());
    auto as_tensor = [](std::vector<int64_t>& v) {
      return at::tensor(at::ArrayRef<int64_t>(v), at::kLong);
    };
    return {as_tensor(ids), as_tensor(mask)};
  }

 private:
  static std::string columns(const ArrowStreamFile& f) {
    std::string s;
    for (int c = 0; c < f.num_columns(); ++c)
      s += (c ? ", " : "") + f.column_name(c) + ": " + f.column_type(c);
    return s.empty() ? "no columns" : s;
  }

  std::string dir_;
  std::vector<std::shared_ptr<ArrowStreamFile>> files_;
  std::vector<int64_t> first_row_;
  int64_t rows_ = 0;
};

// Runs f, turning a format error of one sample's data (an Arrow row, a safetensors header) into
// a BadSampleError, which --skip-bad-samples handles.
template <typename F>
auto per_sample(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const BadSampleError&) {
    throw;
  } catch (const UsageError& e) {
    throw BadSampleError(e.message(), e.hint(), __FILE__, __LINE__);
  }
}

class SpeculatorsDataset final : public FeatureDataset {
 public:
  SpeculatorsDataset(const std::string& dir, DatasetOptions options)
      : root_(dir), options_(options) {
    const fs::path hs_dir = normalized(dir);
    for (const auto& e : fs::directory_iterator(hs_dir)) {
      const int64_t i = hs_index(e.path().filename().string());
      if (i >= 0) rows_.push_back(i);
    }
    std::sort(rows_.begin(), rows_.end());
    FSDP_USAGE_CHECK(!rows_.empty(), dir + ": no hs_<i>.safetensors files",
                     "point at speculators' hidden-state directory");
    const auto dup = std::adjacent_find(rows_.begin(), rows_.end());
    FSDP_USAGE_CHECK(dup == rows_.end(),
                     fsdp::str(dir, ": two files name row ", dup == rows_.end() ? 0 : *dup, " (hs_",
                               dup == rows_.end() ? 0 : *dup, " with and without leading zeros)"),
                     "remove the duplicate");
    // speculators' default layout: <preprocessed>/hidden_states/hs_<i>.safetensors.
    std::vector<fs::path> looked;
    for (const fs::path& c : {hs_dir, hs_dir.parent_path()}) {
      if (c.empty()) continue;
      looked.push_back(c);
      if (fs::exists(c / "state.json")) {
        dataset_ = std::make_unique<PreprocessedRows>(c);
        break;
      }
    }
    std::string places;
    for (const auto& p : looked) places += (places.empty() ? "" : " and ") + p.string();
    FSDP_USAGE_CHECK(dataset_ != nullptr,
                     fsdp::str(dir,
                               ": speculators hidden states, but no preprocessed dataset "
                               "(state.json, dataset_info.json, data-*.arrow) in ",
                               places, "; its loss_mask column is needed"),
                     "keep the hidden states in (or next to) the directory speculators' "
                     "preprocessing saved, whose rows they were generated from");
    FSDP_USAGE_CHECK(rows_.back() < dataset_->rows(),
                     fsdp::str(dir, ": hs_", rows_.back(), ".safetensors but the dataset in ",
                               dataset_->dir(), " has ", dataset_->rows(), " rows"),
                     "the hidden states come from another preprocessed dataset");
  }

  std::string format() const override { return "speculators"; }
  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  const std::string& root() const override { return root_; }
  bool hidden_state_prenorm() const override { return true; }
  std::string source(int64_t i) const override { return path_of(i); }
  std::string source_key(int64_t i) const override { return name_of(i); }
  uint64_t source_bytes(int64_t i) const override {
    std::error_code ec;
    const auto n = fs::file_size(path_of(i), ec);
    return ec ? 0 : static_cast<uint64_t>(n);
  }

  RawSample read(int64_t i) const override {
    const std::string where = path_of(i);
    uint64_t bytes = 0;
    const auto file = open_file(i);
    const auto [ids, mask] = checked_tokens(i, *file, &bytes);
    const int64_t s = ids.size(0);
    const auto [hidden, aux] = per_sample([&] { return hidden_states(*file, s, &bytes); });
    bytes_read_ += bytes;
    return validate_sample(ids, mask, hidden, aux, where, options_);
  }

  TokenSample read_tokens(int64_t i) const override {
    RawSample s = read(i);
    return {s.input_ids, s.loss_mask};
  }

  TokenSample read_tokens_only(int64_t i) const override {
    uint64_t bytes = 0;
    const auto file = open_file(i);
    const auto [ids, mask] = checked_tokens(i, *file, &bytes);
    bytes_read_ += bytes;
    return validate_tokens_only(ids, mask, path_of(i), options_);
  }

 private:
  std::string name_of(int64_t i) const {
    FSDP_CHECK(i >= 0 && i < size(),
               fsdp::str("sample index ", i, " out of range [0, ", size(), ")"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    return fsdp::str("hs_", rows_[i], ".safetensors");
  }
  std::string path_of(int64_t i) const { return (normalized(root_) / name_of(i)).string(); }

  std::shared_ptr<SafetensorsFile> open_file(int64_t i) const {
    const std::string path = path_of(i);
    // vLLM holds <file>.lock while it writes: the file may be complete on the next try.
    if (fs::exists(path + ".lock"))
      throw SampleReadError(path + ": still being written (" + path + ".lock exists)",
                            "wait for the hidden-state generation to finish", __FILE__, __LINE__);
    std::shared_ptr<SafetensorsFile> f = per_sample([&] { return SafetensorsFile::open(path); });
    ++files_opened_;
    return f;
  }

  // The row's input_ids and loss_mask, after checking the file's token_ids against them as
  // speculators does (a dump generated from another dataset or row order fails here).
  std::pair<at::Tensor, at::Tensor> checked_tokens(int64_t i, const SafetensorsFile& f,
                                                   uint64_t* bytes) const {
    const std::string where = path_of(i);
    auto row = per_sample([&] { return dataset_->tokens(rows_[i], bytes); });
    if (!f.contains("token_ids")) bad(where, "no 'token_ids' tensor");
    at::Tensor t = per_sample([&] { return f.read("token_ids"); });
    *bytes += t.nbytes();
    if (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt)
      bad(where, fsdp::str("token_ids has dtype ", t.scalar_type(), ", expected int64"));
    if (t.dim() == 2 && t.size(0) == 1) t = t[0];
    if (t.dim() != 1) bad(where, fsdp::str("token_ids has shape ", t.sizes(), ", expected [S]"));
    t = t.to(at::kLong);
    const std::string row_where =
        fsdp::str("row ", rows_[i], " of the dataset in ", dataset_->dir());
    const std::string hint =
        "the hidden states were generated from another preprocessed dataset "
        "(or row order); point at the one they came from, or regenerate";
    if (t.size(0) != row.first.size(0))
      bad(where,
          fsdp::str("token_ids has ", t.size(0), " tokens, input_ids of ", row_where, " has ",
                    row.first.size(0)),
          hint);
    if (!t.equal(row.first)) {
      const int64_t k = t.ne(row.first).nonzero()[0][0].item<int64_t>();
      bad(where,
          fsdp::str("token_ids differ from input_ids of ", row_where, " at position ", k, " (",
                    t[k].item<int64_t>(), " vs ", row.first[k].item<int64_t>(), ")"),
          hint);
    }
    return row;
  }

  // hidden_states [S, L, H] -> (last layer [S, H], the L-1 others flattened [S, (L-1)*H]), as
  // speculators splits them; fp8 values are dequantised as speculators does, in bf16.
  std::pair<at::Tensor, at::Tensor> hidden_states(const SafetensorsFile& f, int64_t s,
                                                  uint64_t* bytes) const {
    const std::string& where = f.path();
    if (!f.contains("hidden_states")) bad(where, "no 'hidden_states' tensor");
    const auto& shape = f.info("hidden_states").shape;
    if (shape.size() != 3 || shape[0] != s || shape[1] < 2 || shape[2] < 1)
      bad(where, fsdp::str("hidden_states has shape ", at::IntArrayRef(shape), ", expected [", s,
                           ", L, H] with L >= 2 captured layers"));
    const int64_t layers = shape[1], h = shape[2];
    if (options_.num_aux_layers > 0 && layers - 1 != options_.num_aux_layers)
      bad(where,
          fsdp::str("hidden_states holds ", layers, " captured layers (", layers - 1,
                    " auxiliary + the last), the draft reads ", options_.num_aux_layers,
                    " auxiliary layers (", options_.layers_key, "; ", options_.num_aux_layers + 1,
                    " in all)"),
          fsdp::str("capture the layers the draft config names (", options_.layers_key,
                    ") plus the last, or use features dumped for this draft"));
    at::Tensor x = f.read("hidden_states");
    *bytes += x.nbytes();
    if (x.scalar_type() == at::kFloat8_e4m3fn) {
      const std::string key = "hidden_states_scales";
      if (!f.contains(key)) bad(where, "fp8 hidden_states without '" + key + "'");
      at::Tensor scale = f.read(key);
      *bytes += scale.nbytes();
      if (!at::isFloatingType(scale.scalar_type()) || scale.scalar_type() == at::kFloat8_e4m3fn)
        bad(where, fsdp::str(key, " has dtype ", scale.scalar_type(), ", expected float32"));
      const auto sz = scale.sizes().vec();
      if (sz == std::vector<int64_t>{s, 1, 1} || sz == std::vector<int64_t>{s, 1})
        scale = scale.reshape({s, 1, 1});
      else if (sz == std::vector<int64_t>{1})
        scale = scale.reshape({1, 1, 1});
      else
        bad(where, fsdp::str(key, " has shape ", scale.sizes(), ", expected [", s, ",1,1], [", s,
                             ",1] or [1] (one scale per token or per tensor)"));
      const at::Tensor sf = scale.to(at::kFloat);
      if (!(sf.gt(0) & sf.lt(std::numeric_limits<float>::infinity())).all().item<bool>())
        bad(where, key + " holds a scale that is not finite and positive");
      x = x.to(at::kBFloat16) * scale.to(at::kBFloat16);
    }
    return {x.select(1, layers - 1), x.narrow(1, 0, layers - 1).reshape({s, (layers - 1) * h})};
  }

  std::string root_;
  DatasetOptions options_;
  std::vector<int64_t> rows_;  // sample k reads hs_<rows_[k]>.safetensors
  std::unique_ptr<PreprocessedRows> dataset_;
};

}  // namespace

bool is_speculators_dump(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (hs_index(it->path().filename().string()) >= 0) return true;
  return false;
}

std::shared_ptr<FeatureDataset> open_speculators_dataset(const std::string& dir,
                                                         const DatasetOptions& options) {
  return std::make_shared<SpeculatorsDataset>(dir, options);
}

FeatureFormat speculators_feature_format() {
  return {"speculators", "hs_<i>.safetensors", FormatDetection::kDirectory,
          [](const std::string& path) -> FeatureOpener {
            if (!is_speculators_dump(path)) return {};
            return [path](const DatasetOptions& o) { return open_speculators_dataset(path, o); };
          }};
}

}  // namespace fsdp::data
