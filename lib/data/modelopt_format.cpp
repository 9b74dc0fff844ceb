// NVIDIA ModelOpt offline dumps (formats.h): one torch.save dict per conversation,
// {conversation_id}.pt, read with our bounded torch.save reader (core/torch_archive_load.h), never
// torch::pickle_load. Opening only lists the directory; a file's records are read when a sample
// is, and the tokens-only reader never reads the hidden-state records.
#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "core/torch_archive_load.h"
#include "data/dataset_parts.h"
#include "data/formats.h"

namespace fsdp::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRedump =
    "dump this conversation again with ModelOpt's collect_hidden_states, or run with "
    "--skip-bad-samples";
constexpr const char* kPrenormKey = "hidden_states_prenorm";

[[noreturn]] void bad(const std::string& where, const std::string& problem,
                      const std::string& hint = kRedump) {
  throw BadSampleError(where + ": " + problem, hint, __FILE__, __LINE__);
}

// A missing file or a permission does not change; other failures (EIO, a stale NFS handle) may,
// and are retried by the loader.
[[noreturn]] void io_failure(const std::string& path, const ZipIoError& e) {
  const int err = e.error_number;
  if (err == ENOENT || err == EACCES || err == EISDIR || err == ENOTDIR)
    bad(path, e.what(), "check the path and the permissions");
  throw SampleReadError(path + ": " + e.what(), "check the file system", __FILE__, __LINE__);
}

bool is_pt_file(const fs::directory_entry& e) {
  std::error_code ec;
  return e.path().extension() == ".pt" && e.is_regular_file(ec);
}

// What one .pt file holds: the tensors asked for (absent keys are undefined) and the sample's
// key list for errors.
struct PtContents {
  at::Tensor input_ids, loss_mask, hidden_states, aux_hidden_states;
};

// Reads `path` (a torch.save zip of a dict): the directory and data.pkl, then only the storages
// of the keys needed (`with_hidden`: also the two hidden-state tensors). Refuses pre-norm dumps
// and dicts without the keys every ModelOpt dump has.
PtContents load_pt(const std::string& path, bool with_hidden, uint64_t* bytes_read) {
  PtContents out;
  try {
    FileSource file(path);
    char head[2] = {0, 0};
    if (file.size() < 4) bad(path, str("file has only ", file.size(), " bytes"));
    file.read(0, 2, head);
    if (!(head[0] == 'P' && head[1] == 'K')) {
      if (static_cast<unsigned char>(head[0]) == 0x80)
        bad(path, "legacy (non-zip) torch.save format",
            "re-save it in Python with torch.save(obj, path) from torch >= 1.6 (zip format)");
      bad(path, "not a torch.save zip archive (no zip signature)");
    }
    c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
    std::vector<std::string> present;
    try {
      const TorchArchive archive(file);
      const PickleTree& tree = archive.tree();
      const PickleNode& root = tree.at(tree.root);
      if (root.kind == PickleNode::Kind::kDict) {
        for (size_t i = 0; i < root.items.size(); i += 2) {
          const PickleNode& key = tree.at(root.items[i]);
          if (key.kind == PickleNode::Kind::kString) present.push_back(key.s);
        }
      }
      // Every key is checked from the pickle alone, before any storage is read, so the
      // tokens-only reader refuses exactly the files the full reader refuses for their keys.
      for (const char* key : {"input_ids", "hidden_states", "aux_hidden_states"}) {
        if (std::find(present.begin(), present.end(), key) == present.end()) {
          std::string list;
          for (const auto& k : present) list += (list.empty() ? "" : ", ") + k;
          bad(path,
              str("missing key '", key, "' (keys present: ", list.empty() ? "none" : list, ")"),
              "this does not look like a ModelOpt collect_hidden_states dump: " +
                  std::string(kRedump));
        }
      }
      std::vector<std::string> keys = {"input_ids", "loss_mask", kPrenormKey};
      if (with_hidden) {
        keys.push_back("hidden_states");
        keys.push_back("aux_hidden_states");
      }
      dict = load_torch_archive_keys(archive, keys);
    } catch (const FormatError& e) {
      bad(path, std::string("cannot load torch.save archive: ") + e.what());
    }
    if (bytes_read) *bytes_read = file.bytes_read();

    const auto prenorm = dict.find(kPrenormKey);
    if (prenorm != dict.end()) {
      const c10::IValue& v = prenorm->value();
      if (!v.isBool() && !v.isInt() && !v.isNone())
        bad(path, str("key '", kPrenormKey, "' is a ", v.tagKind(), ", expected a bool"));
      // Pre-norm states would need the target's final norm applied per dump, which the dataset
      // cannot express per sample; the transformers backend stores them after the norm.
      if ((v.isBool() && v.toBool()) || (v.isInt() && v.toInt() != 0))
        bad(path,
            "hidden_states were dumped before the target's final norm "
            "(hidden_states_prenorm = True), which is not supported",
            "dump with ModelOpt's transformers backend (its hidden_states are after the final "
            "norm), or convert the dump to post-norm states");
    }
    auto tensor = [&](const char* key, at::Tensor* dst) {
      const auto it = dict.find(key);
      if (it == dict.end()) return;
      if (!it->value().isTensor())
        bad(path, str("key '", key, "' is a ", it->value().tagKind(), ", not a tensor"));
      *dst = it->value().toTensor();
    };
    tensor("input_ids", &out.input_ids);
    tensor("loss_mask", &out.loss_mask);
    tensor("hidden_states", &out.hidden_states);
    tensor("aux_hidden_states", &out.aux_hidden_states);
  } catch (const ZipIoError& e) {
    io_failure(path, e);
  }
  // Older dumps carry no loss_mask, and ModelOpt then trains on every token (its loader uses all
  // ones): the same here, so both trainers see the same targets.
  if (!out.loss_mask.defined() && out.input_ids.defined())
    out.loss_mask = at::ones(out.input_ids.sizes(), at::kLong);
  return out;
}

class ModeloptDataset final : public FileListDataset {
 public:
  using FileListDataset::FileListDataset;
  std::string format() const override { return "modelopt"; }

  RawSample read(int64_t i) const override {
    uint64_t n = 0;
    const PtContents c = load_pt(open_file(i), true, &n);
    bytes_read_ += n;
    return validate_sample(c.input_ids, c.loss_mask, c.hidden_states, c.aux_hidden_states,
                           files_[i], options_);
  }

  TokenSample read_tokens(int64_t i) const override {
    // The whole sample is read and checked, so a sample training would skip is not counted.
    RawSample s = read(i);
    return {s.input_ids, s.loss_mask};
  }

  TokenSample read_tokens_only(int64_t i) const override {
    uint64_t n = 0;
    const PtContents c = load_pt(open_file(i), false, &n);
    bytes_read_ += n;
    return validate_tokens_only(c.input_ids, c.loss_mask, files_[i], options_);
  }
};

// The *.pt files directly in `dir` (not below it: ModelOpt writes a flat directory, and its
// vocab_mapping subdirectory is not features), sorted byte-wise by name.
std::vector<std::string> list_pt_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (is_pt_file(*it)) files.push_back(it->path().filename().string());
  }
  FSDP_USAGE_CHECK(!ec, dir + ": cannot list (" + ec.message() + ")",
                   "check the path and its permissions");
  std::sort(files.begin(), files.end());
  for (auto& f : files) f = (fs::path(dir) / f).string();
  return files;
}

}  // namespace

bool is_modelopt_dump(const std::string& dir) {
  std::error_code ec;
  bool pt = false;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const fs::path& p = it->path();
    // A directory with .ckpt files is a SpecForge tree, whatever else it holds.
    if (p.extension() == ".ckpt" || (p.extension() == ".gz" && p.stem().extension() == ".ckpt"))
      return false;
    if (is_pt_file(*it)) pt = true;
  }
  return pt;
}

std::shared_ptr<FeatureDataset> open_modelopt_dataset(const std::string& dir,
                                                      const DatasetOptions& options) {
  auto files = list_pt_files(dir);
  FSDP_USAGE_CHECK(!files.empty(), dir + ": no *.pt files (ModelOpt dumps) in this directory",
                   "point the path at the directory ModelOpt's collect_hidden_states wrote");
  return std::make_shared<ModeloptDataset>(dir, std::move(files), options);
}

FeatureFormat modelopt_feature_format() {
  return {"modelopt", "*.pt", FormatDetection::kDirectory,
          [](const std::string& path) -> FeatureOpener {
            if (!is_modelopt_dump(path)) return {};
            return [path](const DatasetOptions& o) { return open_modelopt_dataset(path, o); };
          }};
}

}  // namespace fsdp::data
