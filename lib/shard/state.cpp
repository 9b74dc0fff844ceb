// Engine state in and out: full fp32 tensors by name (export, initial weights) and per-rank
// shard files with a manifest of the flat layouts, loadable at another world size. Never writes
// outside the directory it is given and never changes the flat layout while loading.
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>

#include "comm/communicator.h"
#include "comm/runtime.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "core/torch_archive_load.h"
#include "shard/engine.h"
#include "shard/flat_param.h"

namespace fsdp::shard {

std::map<std::string, at::Tensor> ShardEngine::full_state(
    bool rank0_only, bool include_frozen, const std::set<std::string>& skip_frozen_units) {
  finish_backward();
  c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> out;
  comm::Communicator* sc = groups_.shard.get();
  const bool keep = !rank0_only || (shard_rank() == 0 && replicate_rank() == 0);
  for (FlatParam* f : flat_params()) {
    if (!f->trainable() && (!include_frozen || skip_frozen_units.count(f->layout().unit)))
      continue;  // the same choice on every rank
    const FlatLayout& l = f->layout();
    // Gather in fp32 on the communicator's device, then slice per parameter on the host.
    const c10::Device dev =
        sc && sc->device_type() != c10::kCPU ? options_.device : c10::Device(c10::kCPU);
    at::Tensor shard = f->master().to(dev, at::kFloat).contiguous();
    at::Tensor full;
    if (sc && sc->size() > 1) {
      full = at::empty({l.padded_numel}, shard.options());
      sc->all_gather(shard, full)->wait();
    } else {
      full = shard;
    }
    if (!keep) continue;
    full = full.cpu();
    for (const ParamSlot& p : l.params) {
      out[p.name] = full.narrow(0, p.offset, p.numel).view(p.shape).clone();
    }
  }
  return out;
}

void ShardEngine::load_full_state(const std::map<std::string, at::Tensor>& tensors,
                                  bool allow_missing) {
  finish_backward();
  c10::NoGradGuard no_grad;
  // Every rank checks every tensor (not only those in its shard) so all ranks agree on errors.
  for (FlatParam* f : flat_params()) {
    for (const ParamSlot& p : f->layout().params) {
      auto it = tensors.find(p.name);
      FSDP_CHECK(it != tensors.end() || allow_missing,
                 str("tensor '", p.name, "' is missing from the loaded state"),
                 "load a state saved from the same model, or allow missing tensors");
      FSDP_CHECK(it == tensors.end() || it->second.sizes().vec() == p.shape,
                 fsdp::str("tensor '", p.name, "' has shape ", it->second.sizes(),
                           ", the model has ", c10::IntArrayRef(p.shape)),
                 "load a state saved from a model with the same configuration");
    }
  }
  for (FlatParam* f : flat_params()) {
    const FlatLayout& l = f->layout();
    for (const ShardPiece& piece : shard_pieces(l, f->shard_rank())) {
      const ParamSlot& p = l.params[piece.param];
      auto it = tensors.find(p.name);
      if (it == tensors.end()) continue;
      at::Tensor src = it->second.reshape({-1}).narrow(0, piece.param_offset, piece.length);
      f->master().narrow(0, piece.shard_offset, piece.length).copy_(src);
    }
    f->refresh_after_update();
  }
}

namespace {

constexpr const char* kMagic = "fsdp-shard-state";
constexpr int kVersion = 1;

// POSIX calls rather than std::filesystem: the PyTorch wheel's libtorch exports its own
// std::filesystem symbols, which can shadow libstdc++'s and crash (seen with remove_all).
std::string shard_file(const std::string& dir, int shard_rank) {
  return dir + "/" + str("shard_", shard_rank, ".pt");
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = path + ".tmp";
  write_file_durably(tmp, bytes.data(), bytes.size());
  FSDP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0,
             str("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)),
             "check the directory's permissions");
}

// torch::jit::pickle_save(value)'s bytes (the pickle with its type tags, then one zip record per
// storage), written to `path` (via path.tmp and a rename) as they are produced: the archive is
// never held in memory next to the tensors it holds (6 GB for the llama3-8B draft's optimizer
// state on one rank).
void write_pickle_file(const std::string& path, const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream os(tmp, std::ios::binary);
    FSDP_CHECK(os.good(), str("cannot write ", tmp), "check that the directory is writable");
    // Always report success to the writer: it throws on a short write and then throws again
    // from its destructor (std::terminate). A failed stream is detected at close below.
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) -> size_t {
      if (os.good()) os.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                       writer);
    writer.writeEndOfFile();
    os.close();  // a full disk shows here, when the last buffer is written
    FSDP_CHECK(!os.fail(), str("write to ", tmp, " failed (", std::strerror(errno), ")"),
               "check free disk space");
  }
  fsync_file(tmp);  // on disk before its name says so
  FSDP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0,
             str("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)),
             "check the directory's permissions");
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  FSDP_CHECK(is.good(), str("cannot read ", path),
             "the state directory is incomplete: every shard_<r>.pt of the manifest must exist");
  return std::vector<char>((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
}

struct SavedFlat {
  FlatLayout layout;
  std::string dtype;
};

struct Manifest {
  std::string strategy;
  int shard_size = 0;
  int replicate_size = 0;
  int64_t step = 0;
  std::string optimizer = "adamw";  // "muon": exp_avg holds Muon's momentum for its matrices
  int64_t optimizer_since = 0;      // ShardEngine::optimizer_since
  std::vector<SavedFlat> flats;
};

void write_manifest(const std::string& path, const ShardEngine& e) {
  std::ostringstream os;
  os << kMagic << ' ' << kVersion << '\n';
  os << "strategy " << strategy_name(e.options().strategy) << '\n';
  os << "shard_size " << e.shard_size() << '\n';
  os << "replicate_size " << e.replicate_size() << '\n';
  os << "step " << e.step_count() << '\n';
  if (e.options().muon) os << "optimizer muon\n";  // absent: AdamW (every older manifest)
  if (e.optimizer_since() != 0) os << "optimizer_since " << e.optimizer_since() << '\n';
  for (FlatParam* f : e.flat_params()) {
    const FlatLayout& l = f->layout();
    os << "flat " << l.unit << ' ' << (l.trainable ? 1 : 0) << ' ' << l.numel << ' '
       << l.padded_numel << ' ' << l.shard_numel << ' ' << dtype_name(f->master().scalar_type())
       << ' ' << l.params.size() << '\n';
    for (const ParamSlot& p : l.params) {
      os << "param " << p.name << ' ' << p.offset << ' ' << p.numel << ' ' << (p.decay ? 1 : 0)
         << ' ' << p.shape.size();
      for (int64_t d : p.shape) os << ' ' << d;
      os << '\n';
    }
  }
  const std::string s = os.str();
  write_bytes(path, std::vector<char>(s.begin(), s.end()));
}

Manifest read_manifest(const std::string& path) {
  std::vector<char> bytes = read_bytes(path);
  std::istringstream is(std::string(bytes.begin(), bytes.end()));
  Manifest m;
  std::string magic;
  int version = 0;
  is >> magic >> version;
  FSDP_CHECK(magic == kMagic && version == kVersion,
             str(path, " is not a shard state manifest of version ", kVersion),
             "point the loader at a directory written by save_state");
  std::string key;
  while (is >> key) {
    if (key == "strategy") {
      is >> m.strategy;
    } else if (key == "shard_size") {
      is >> m.shard_size;
    } else if (key == "replicate_size") {
      is >> m.replicate_size;
    } else if (key == "step") {
      is >> m.step;
    } else if (key == "optimizer") {
      is >> m.optimizer;
    } else if (key == "optimizer_since") {
      is >> m.optimizer_since;
    } else if (key == "flat") {
      SavedFlat f;
      int trainable = 0;
      size_t nparams = 0;
      is >> f.layout.unit >> trainable >> f.layout.numel >> f.layout.padded_numel >>
          f.layout.shard_numel >> f.dtype >> nparams;
      f.layout.trainable = trainable != 0;
      f.layout.group_size = m.shard_size;
      for (size_t i = 0; i < nparams && is; ++i) {
        ParamSlot p;
        std::string tag;
        int decay = 0;
        size_t ndim = 0;
        is >> tag >> p.name >> p.offset >> p.numel >> decay >> ndim;
        FSDP_CHECK(tag == "param", str(path, ": expected 'param' line in flat ", f.layout.unit),
                   "the manifest is corrupt; use another checkpoint");
        p.decay = decay != 0;
        p.shape.resize(ndim);
        for (auto& d : p.shape) is >> d;
        f.layout.params.push_back(std::move(p));
      }
      m.flats.push_back(std::move(f));
    } else {
      FSDP_FAIL(str(path, ": unknown manifest key '", key, "'"),
                "the manifest is corrupt or from a newer version");
    }
    FSDP_CHECK(!is.fail(), str(path, ": malformed line for '", key, "'"),
               "the manifest is corrupt; use another checkpoint");
  }
  FSDP_CHECK(m.shard_size >= 1, str(path, ": missing shard_size"), "the manifest is corrupt");
  return m;
}

void check_same_layout(const std::string& path, const FlatLayout& saved, const FlatLayout& now) {
  bool same = saved.numel == now.numel && saved.params.size() == now.params.size();
  for (size_t i = 0; same && i < now.params.size(); ++i) {
    same = saved.params[i].name == now.params[i].name &&
           saved.params[i].shape == now.params[i].shape &&
           saved.params[i].offset == now.params[i].offset;
  }
  FSDP_CHECK(same, str(path, ": the flat layout of ", now.key(), " differs from the model's"),
             "resume with the same model configuration and the same unit list");
}

using ShardFile = c10::Dict<std::string, at::Tensor>;

ShardFile read_shard_file(const std::string& path) {
  const std::vector<char> bytes = read_bytes(path);
  c10::IValue v;
  try {
    v = load_torch_archive(bytes);
  } catch (const FormatError& e) {
    FSDP_FAIL(str(path, ": ", e.what()), "the state file is damaged; use another checkpoint");
  }
  FSDP_CHECK(v.isGenericDict(), str(path, " does not hold a dict of tensors"),
             "the state file is corrupt; use another checkpoint");
  ShardFile out;
  for (const auto& kv : v.toGenericDict()) {
    FSDP_CHECK(kv.key().isString() && kv.value().isTensor(),
               str(path, " holds an entry that is not a named tensor"),
               "the state file is corrupt; use another checkpoint");
    out.insert(kv.key().toStringRef(), kv.value().toTensor());
  }
  return out;
}

}  // namespace

std::map<std::string, at::Tensor> consolidate_state(const std::string& dir, bool include_frozen) {
  const std::string mpath = dir + "/manifest.txt";
  const Manifest m = read_manifest(mpath);
  c10::NoGradGuard no_grad;
  // One full buffer per flat; the shard files are read one at a time (each also holds the Adam
  // moments, twice the weights again).
  std::vector<at::Tensor> full(m.flats.size());
  for (int r = 0; r < m.shard_size; ++r) {
    const std::string path = shard_file(dir, r);
    const ShardFile d = read_shard_file(path);
    for (size_t i = 0; i < m.flats.size(); ++i) {
      const FlatLayout& l = m.flats[i].layout;
      if (!include_frozen && !l.trainable) continue;
      const std::string key = l.key() + "/master";
      FSDP_CHECK(d.contains(key), str(path, " lacks ", key),
                 "the state file is corrupt; use another checkpoint");
      const at::Tensor src = d.at(key);
      FSDP_CHECK(src.dim() == 1 && src.numel() == l.shard_numel,
                 str(path, ": ", key, " has ", src.numel(), " elements, the manifest says ",
                     l.shard_numel),
                 "the state file is corrupt; use another checkpoint");
      if (!full[i].defined()) full[i] = at::empty({l.shard_numel * m.shard_size}, src.options());
      full[i].narrow(0, r * l.shard_numel, l.shard_numel).copy_(src);
    }
  }
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < m.flats.size(); ++i) {
    if (!full[i].defined()) continue;  // a frozen buffer left out
    for (const ParamSlot& p : m.flats[i].layout.params) {
      out[p.name] = full[i].narrow(0, p.offset, p.numel).view(p.shape);
    }
  }
  return out;
}

c10::Dict<std::string, at::Tensor> shard_state_dict(ShardEngine& engine) {
  c10::Dict<std::string, at::Tensor> dict;
  for (FlatParam* f : engine.flat_params()) {
    const std::string k = f->layout().key();
    dict.insert(k + "/master", f->master().cpu());
    if (f->trainable()) {
      dict.insert(k + "/exp_avg", f->exp_avg().cpu());
      dict.insert(k + "/exp_avg_sq", f->exp_avg_sq().cpu());
    }
  }
  return dict;
}

void save_state(ShardEngine& engine, const std::string& dir) {
  engine.finish_backward();
  // A write error (full disk) is rethrown after the barriers, so that the other ranks are not
  // left waiting in them and the caller can agree with them on the failure.
  std::exception_ptr write_error;
  try {
    // Tests make one rank's writes fail (tests/e2e/save_failures.sh).
    const std::optional<int64_t> fail_rank = env::integer("FSDP_TEST_FAIL_WRITES_ON_RANK");
    FSDP_CHECK(!fail_rank || *fail_rank != comm::topology().world_rank,
               "state write failed: injected by FSDP_TEST_FAIL_WRITES_ON_RANK",
               "unset FSDP_TEST_FAIL_WRITES_ON_RANK: it makes writes fail, for tests only");
    make_dirs(dir);
    // Replicas hold identical shards: only replicate rank 0 writes.
    if (engine.replicate_rank() == 0) {
      write_pickle_file(shard_file(dir, engine.shard_rank()),
                        c10::IValue(shard_state_dict(engine)));
      if (engine.shard_rank() == 0) write_manifest(dir + "/manifest.txt", engine);
      fsync_file(dir);  // the renamed names are on disk too, before the completion marker
    }
  } catch (const std::exception&) {
    write_error = std::current_exception();
  }
  // Every file exists before any rank returns.
  if (engine.groups().shard) engine.groups().shard->barrier();
  if (engine.groups().replicate) engine.groups().replicate->barrier();
  if (write_error) std::rethrow_exception(write_error);
}

void load_state(ShardEngine& engine, const std::string& dir, bool fresh_optimizer) {
  engine.finish_backward();
  const std::string mpath = dir + "/manifest.txt";
  const Manifest m = read_manifest(mpath);
  // Muon keeps its momentum where AdamW keeps its first moment: the other optimizer would read
  // it as its own state.
  const std::string now = engine.options().muon ? "muon" : "adamw";
  FSDP_USAGE_CHECK(
      fresh_optimizer || m.optimizer == now,
      str(dir, " holds ", m.optimizer, "'s optimizer state, and this run uses --optimizer ", now),
      str("resume with --optimizer ", m.optimizer,
          ", or add --reset-optimizer-state to start the new optimizer's state fresh"));
  std::map<int, ShardFile> files;
  auto file = [&](int r) -> const ShardFile& {
    auto it = files.find(r);
    if (it == files.end()) it = files.emplace(r, read_shard_file(shard_file(dir, r))).first;
    return it->second;
  };
  c10::NoGradGuard no_grad;
  for (FlatParam* f : engine.flat_params()) {
    const FlatLayout& now = f->layout();
    const SavedFlat* saved = nullptr;
    for (const auto& s : m.flats)
      if (s.layout.unit == now.unit && s.layout.trainable == now.trainable) saved = &s;
    FSDP_CHECK(saved, str(mpath, " has no state for ", now.key()),
               "resume with the same model configuration and the same unit list");
    check_same_layout(mpath, saved->layout, now);
    std::vector<std::pair<std::string, at::Tensor>> targets = {{"/master", f->master()}};
    if (f->trainable() && fresh_optimizer) {
      f->exp_avg().zero_();
      f->exp_avg_sq().zero_();
    } else if (f->trainable()) {
      targets.push_back({"/exp_avg", f->exp_avg()});
      targets.push_back({"/exp_avg_sq", f->exp_avg_sq()});
    }
    for (const auto& seg :
         reshard_segments(now.numel, saved->layout.shard_numel, now.shard_numel, f->shard_rank())) {
      FSDP_CHECK(seg.src_rank < m.shard_size,
                 str(mpath, ": ", now.key(), " needs shard ", seg.src_rank, " of ", m.shard_size),
                 "the manifest is corrupt");
      const auto& d = file(seg.src_rank);
      for (const auto& [suffix, dst] : targets) {
        const std::string key = now.key() + suffix;
        FSDP_CHECK(d.contains(key), str(shard_file(dir, seg.src_rank), " lacks ", key),
                   "the state file is corrupt; use another checkpoint");
        at::Tensor src = d.at(key);
        FSDP_CHECK(src.numel() == saved->layout.shard_numel,
                   str(shard_file(dir, seg.src_rank), ": ", key, " has ", src.numel(),
                       " elements, the manifest says ", saved->layout.shard_numel),
                   "the state file is corrupt; use another checkpoint");
        dst.narrow(0, seg.dst_offset, seg.length).copy_(src.narrow(0, seg.src_offset, seg.length));
      }
    }
    f->refresh_after_update();
  }
  engine.set_step_count(m.step);
  engine.set_optimizer_since(fresh_optimizer ? m.step : m.optimizer_since);
}

}  // namespace fsdp::shard
