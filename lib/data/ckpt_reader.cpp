// SpecForge .ckpt reading and the sample validation shared by every reader (dataset.h).
// Loads with our own bounded torch.save reader (core/torch_archive.h): tensors and containers only,
// every record checked against its bytes, nothing ever executed; a file's records are read from
// disk only when needed (the tokens-only reader never reads the hidden states).
#include <ATen/ATen.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/finite.h"
#include "core/gzip_reader.h"
#include "core/torch_archive_load.h"
#include "data/dataset.h"

namespace fsdp::data {

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& problem,
                      const std::string& hint) {
  throw BadSampleError(where + ": " + problem, hint, __FILE__, __LINE__);
}

constexpr const char* kRegenerate =
    "regenerate this file with SpecForge's prepare_hidden_states, or run with --skip-bad-samples";

// Accepts [S] or [1,S]; returns [S] int64. `allowed` lists the accepted dtypes.
at::Tensor token_tensor(const at::Tensor& t, const char* key, const std::string& where,
                        bool allow_bool) {
  const auto d = t.scalar_type();
  const bool ok =
      d == at::kLong || d == at::kInt || (allow_bool && (d == at::kBool || d == at::kByte));
  if (!ok)
    bad(where,
        fsdp::str(key, " has dtype ", dtype_name(d), ", expected int64",
                  allow_bool ? " (int32, bool, uint8 accepted)" : " (int32 accepted)"),
        kRegenerate);
  at::Tensor x = t;
  if (x.dim() == 2 && x.size(0) == 1) x = x[0];
  if (x.dim() != 1)
    bad(where, fsdp::str(key, " has shape ", t.sizes(), ", expected [S] or [1,S]"), kRegenerate);
  return x.to(at::kLong).contiguous();
}

// Accepts [1,S,W] or [S,W]; returns [S,W] bf16.
at::Tensor hidden_tensor(const at::Tensor& t, const char* key, const std::string& where) {
  const auto d = t.scalar_type();
  if (d != at::kBFloat16 && d != at::kHalf && d != at::kFloat)
    bad(where, fsdp::str(key, " has dtype ", dtype_name(d), ", expected bf16 (fp16/fp32 accepted)"),
        kRegenerate);
  at::Tensor x = t;
  if (x.dim() == 3 && x.size(0) == 1) x = x[0];
  if (x.dim() != 2)
    bad(where, fsdp::str(key, " has shape ", t.sizes(), ", expected [1,S,W] or [S,W]"),
        kRegenerate);
  return d == at::kBFloat16 ? x.contiguous() : x.to(at::kBFloat16).contiguous();
}

}  // namespace

namespace {

// The token checks shared by the whole-sample and the tokens-only readers.
TokenSample validate_tokens(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                            const std::string& where, const DatasetOptions& options) {
  TokenSample s{token_tensor(input_ids, "input_ids", where, false),
                token_tensor(loss_mask, "loss_mask", where, true)};
  const int64_t n = s.input_ids.size(0);
  if (n == 0) bad(where, "input_ids is empty (S = 0)", kRegenerate);
  if (s.loss_mask.size(0) != n)
    bad(where, fsdp::str("lengths disagree: input_ids ", n, ", loss_mask ", s.loss_mask.size(0)),
        kRegenerate);
  const int64_t lo = s.input_ids.min().item<int64_t>(), hi = s.input_ids.max().item<int64_t>();
  if (lo < 0) bad(where, fsdp::str("input_ids has a negative id (", lo, ")"), kRegenerate);
  if (options.vocab_size > 0 && hi >= options.vocab_size)
    bad(where, fsdp::str("input_ids has id ", hi, " >= vocab_size ", options.vocab_size),
        "the features come from another tokenizer than the target model's");
  if (!(s.loss_mask.eq(0) | s.loss_mask.eq(1)).all().item<bool>())
    bad(where, "loss_mask has values other than 0 and 1", kRegenerate);
  return s;
}

// The keys of a .ckpt in the order read: tokens first, then the dataset's feature contract
// (DatasetOptions::hidden_key, aux_key). An optional key may be absent, a skipped one is never
// read (both: an undefined tensor).
struct CkptKey {
  std::string name;
  bool optional = false;
  bool skip = false;
};
std::vector<CkptKey> ckpt_keys(const DatasetOptions& o, int count) {
  using LastHidden = DatasetOptions::LastHidden;
  std::vector<CkptKey> keys{
      {"input_ids"},
      {"loss_mask"},
      {o.hidden_key, o.last_hidden != LastHidden::kRequired, o.last_hidden == LastHidden::kUnused},
      {o.aux_key}};
  keys.resize(static_cast<size_t>(count));
  return keys;
}

// Those keys from the .ckpt at `path`, read through a FileSource: the directory, data.pkl and
// those keys' storages only. Throws BadSampleError naming the file (SampleReadError for a
// failing file system).
std::vector<at::Tensor> load_ckpt_tensors(const std::string& path, const std::vector<CkptKey>& keys,
                                          uint64_t* bytes_read,
                                          std::vector<std::string>* names_out = nullptr);

}  // namespace

RawSample validate_sample(at::Tensor input_ids, at::Tensor loss_mask, at::Tensor hidden_state,
                          at::Tensor aux_hidden_state, const std::string& where,
                          const DatasetOptions& options, const RowWindow* rows) {
  TokenSample tokens = validate_tokens(input_ids, loss_mask, where, options);
  RawSample s;
  s.source = where;
  s.input_ids = std::move(tokens.input_ids);
  s.loss_mask = std::move(tokens.loss_mask);
  // A contract without the last hidden state (DFlash): its width is the dataset's hidden size.
  if (hidden_state.defined())
    s.hidden_state = hidden_tensor(hidden_state, "hidden_state", where);
  else if (options.last_hidden == DatasetOptions::LastHidden::kRequired)
    bad(where, "no target last hidden state (hidden_state), which this draft reads", kRegenerate);
  s.aux_hidden_state = hidden_tensor(aux_hidden_state, "aux_hidden_state", where);
  const int64_t n = s.input_ids.size(0);
  const int64_t hidden_rows =
      rows ? rows->hidden : (s.hidden_state.defined() ? s.hidden_state.size(0) : n);
  const int64_t aux_rows = rows ? rows->aux : s.aux_hidden_state.size(0);
  if (hidden_rows != n || aux_rows != n)
    bad(where,
        fsdp::str("lengths disagree: input_ids ", n, ", hidden_state ", hidden_rows,
                  ", aux_hidden_state ", aux_rows),
        kRegenerate);
  if (rows) s.row_offset = rows->from;
  const int64_t h = s.hidden_state.defined() ? s.hidden_state.size(1) : options.hidden_size;
  if (h == 0 && !s.hidden_state.defined())
    bad(where,
        "no target last hidden state and no hidden size given: the captured layers' width "
        "n x H cannot be split",
        "give the target's hidden size (convert: --target-model-path)");
  if (h == 0) bad(where, "hidden_state has hidden size 0", kRegenerate);
  const int64_t w = s.aux_hidden_state.size(1);
  // 0: any number of captured layers (convert keeps what the producer captured).
  const int64_t n_aux = options.num_aux_layers > 0 ? options.num_aux_layers
                        : (w > 0 && w % h == 0)    ? w / h
                                                   : 1;
  if (w != n_aux * h)
    bad(where,
        w % h == 0 ? fsdp::str("aux_hidden_state holds ", w / h, " captured layers (width ", w,
                               " = ", w / h, " x ", h, "), the draft reads ", n_aux, " (",
                               options.layers_key, ")")
                   : fsdp::str("aux_hidden_state has width ", w, ", expected ", n_aux, " x ", h,
                               " (", n_aux, " captured layers of hidden size ", h, ")"),
        w % h == 0 ? fsdp::str("capture the layers the draft config names (", options.layers_key,
                               "), or use features dumped for this draft")
                   : kRegenerate);
  if (options.hidden_size > 0 && h != options.hidden_size)
    bad(where, fsdp::str("hidden size ", h, " but the dataset/target has ", options.hidden_size),
        "all feature files must come from the same target model as --target-model-path");
  if (options.check_finite) {
    if (s.hidden_state.defined() && !all_finite(s.hidden_state))
      bad(where, "hidden_state contains NaN or Inf", kRegenerate);
    if (!all_finite(s.aux_hidden_state))
      bad(where, "aux_hidden_state contains NaN or Inf", kRegenerate);
  }
  // Read and checked (the widths), but the algorithm has no use for it: samples with and without
  // it batch alike.
  if (options.last_hidden == DatasetOptions::LastHidden::kUnused) s.hidden_state = at::Tensor();
  return s;
}

namespace {

[[noreturn]] void io_failure(const std::string& path, const ZipIoError& e) {
  const int err = e.error_number;
  // A missing file or a permission is not going to change; other failures (a stale NFS
  // handle, an I/O error) may, and are retried by the loader.
  if (err == ENOENT || err == EACCES || err == EISDIR || err == ENOTDIR)
    bad(path, e.what(), "check the path and the permissions");
  throw SampleReadError(path + ": " + e.what(), "check the file system", __FILE__, __LINE__);
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// `keys` from a torch.save zip held by `file` (`path` names it in errors; `gz`: the bytes came
// out of a gzip file). With `names`, stores the dict's string keys in file order.
std::vector<at::Tensor> load_from_source(const ZipSource& file, const std::string& path,
                                         const std::vector<CkptKey>& keys, bool gz,
                                         std::vector<std::string>* names_out) {
  char head[2] = {0, 0};
  if (file.size() < 4)
    bad(path, fsdp::str(gz ? "decompressed content" : "file", " has only ", file.size(), " bytes"),
        kRegenerate);
  file.read(0, 2, head);
  if (!(head[0] == 'P' && head[1] == 'K')) {
    if (static_cast<unsigned char>(head[0]) == 0x80)
      bad(path, "legacy (non-zip) torch.save format",
          "re-save it in Python with torch.save(obj, path) from torch >= 1.6 (zip format)");
    bad(path,
        gz ? "decompressed content is not a torch.save zip archive (no zip signature)"
           : "not a torch.save zip archive (no zip signature)",
        kRegenerate);
  }
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  std::string present;
  try {
    const TorchArchive archive(file);
    const PickleTree& tree = archive.tree();
    if (tree.at(tree.root).kind == PickleNode::Kind::kDict) {
      for (size_t i = 0; i < tree.at(tree.root).items.size(); i += 2) {
        const PickleNode& key = tree.at(tree.at(tree.root).items[i]);
        if (key.kind != PickleNode::Kind::kString) continue;
        present += (present.empty() ? "" : ", ") + key.s;
        if (names_out) names_out->push_back(key.s);
      }
    }
    std::vector<std::string> names;
    for (const auto& k : keys)
      if (!k.skip) names.push_back(k.name);
    dict = load_torch_archive_keys(archive, names);
  } catch (const FormatError& e) {
    bad(path, std::string("cannot load torch.save archive: ") + e.what(), kRegenerate);
  }
  std::vector<at::Tensor> out;
  for (const auto& key : keys) {
    const auto it = key.skip ? dict.end() : dict.find(key.name);
    if (it == dict.end() && key.optional) {
      out.emplace_back();
      continue;
    }
    if (it == dict.end())
      bad(path,
          fsdp::str("missing key '", key.name,
                    "' (keys present: ", present.empty() ? "none" : present, ")"),
          kRegenerate);
    if (!it->value().isTensor())
      bad(path, fsdp::str("key '", key.name, "' is a ", it->value().tagKind(), ", not a tensor"),
          kRegenerate);
    out.push_back(it->value().toTensor());
  }
  return out;
}

std::vector<at::Tensor> load_ckpt_tensors(const std::string& path, const std::vector<CkptKey>& keys,
                                          uint64_t* bytes_read,
                                          std::vector<std::string>* names_out) {
  try {
    if (ends_with(path, ".gz")) {
      uint64_t compressed = 0;
      std::vector<char> bytes;
      try {
        bytes = gunzip_file(path, {}, &compressed);
      } catch (const FormatError& e) {
        bad(path, std::string("cannot decompress: ") + e.what(),
            "re-copy the file (gzip -t checks it), regenerate it with SpecForge's "
            "prepare_hidden_states --compress, or run with --skip-bad-samples");
      }
      const MemorySource memory(bytes);
      auto out = load_from_source(memory, path, keys, true, names_out);
      if (bytes_read) *bytes_read = compressed;
      return out;
    }
    FileSource file(path);
    auto out = load_from_source(file, path, keys, false, names_out);
    if (bytes_read) *bytes_read = file.bytes_read();
    return out;
  } catch (const ZipIoError& e) {
    io_failure(path, e);
  }
}

}  // namespace

TokenSample validate_tokens_only(at::Tensor input_ids, at::Tensor loss_mask,
                                 const std::string& where, const DatasetOptions& options) {
  return validate_tokens(input_ids, loss_mask, where, options);
}

RawSample read_ckpt_sample(const std::string& path, const DatasetOptions& options,
                           uint64_t* bytes_read) {
  const std::vector<at::Tensor> t = load_ckpt_tensors(path, ckpt_keys(options, 4), bytes_read);
  return validate_sample(t[0], t[1], t[2], t[3], path, options);
}

std::vector<std::string> read_ckpt_key_names(const std::string& path) {
  std::vector<std::string> names;
  load_ckpt_tensors(path, {}, nullptr, &names);
  return names;
}

TokenSample read_ckpt_tokens(const std::string& path, const DatasetOptions& options,
                             uint64_t* bytes_read) {
  const std::vector<at::Tensor> t = load_ckpt_tensors(path, ckpt_keys(options, 2), bytes_read);
  return validate_tokens(t[0], t[1], path, options);
}

}  // namespace fsdp::data
