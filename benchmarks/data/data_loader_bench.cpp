// Loader at disk speed: for .ckpt, .ckpt.gz, native bf16 and native fp8 copies of the same
// generated samples, bytes on disk, a raw sequential read of the files, and the DataLoader (1 and
// 2 threads) over one epoch, with the files dropped from the page cache first (--cold, the
// default) or not (--warm); then the first-batch latency on a dataset of many tiny .ckpt files.
// Prints ratios measured in the same run; never hard-codes a number.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/fs_util.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/native_format.h"
#include "data/torch_save.h"

namespace fs = std::filesystem;
using namespace fsdp::data;

namespace {

constexpr double kMiB = 1048576.0;

struct Flags {
  double size_mb = 1024;
  int64_t hidden = 1024;
  int64_t min_len = 256, max_len = 512;
  int64_t batch = 4;
  int epochs = 0;  // 0: 1 when cold, 2 when warm
  std::vector<std::string> formats = {"ckpt", "gz", "bf16", "fp8"};
  int64_t many_files = 100000;
  bool cold = true;
  std::string dir = (fs::temp_directory_path() / "fsdp_data_bench").string();
  bool keep = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty() && item != "none") out.push_back(item);
  return out;
}

[[noreturn]] void usage(int code) {
  std::fprintf(
      code == 0 ? stdout : stderr,
      "usage: data_loader_bench [--size-mb 1024] [--hidden-size 1024] [--min-len 256]\n"
      "  [--max-len 512] [--batch 4] [--epochs N] [--formats ckpt,gz,bf16,fp8|none]\n"
      "  [--many-files 100000] [--cold|--warm] [--dir DIR] [--keep]\n"
      "  --cold (default): every timed read starts with the files dropped from the page cache\n"
      "  (fdatasync + posix_fadvise DONTNEED); --many-files 0 skips the many-files part\n");
  std::exit(code);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--size-mb")
      f.size_mb = std::stod(val());
    else if (a == "--hidden-size")
      f.hidden = std::stoll(val());
    else if (a == "--min-len")
      f.min_len = std::stoll(val());
    else if (a == "--max-len")
      f.max_len = std::stoll(val());
    else if (a == "--batch")
      f.batch = std::stoll(val());
    else if (a == "--epochs")
      f.epochs = std::stoi(val());
    else if (a == "--formats")
      f.formats = split_list(val());
    else if (a == "--many-files")
      f.many_files = std::stoll(val());
    else if (a == "--cold")
      f.cold = true;
    else if (a == "--warm")
      f.cold = false;
    else if (a == "--dir")
      f.dir = val();
    else if (a == "--keep")
      f.keep = true;
    else
      usage(a == "--help" ? 0 : 2);
  }
  for (const auto& fmt : f.formats)
    if (fmt != "ckpt" && fmt != "gz" && fmt != "bf16" && fmt != "fp8") {
      std::fprintf(stderr, "--formats: unknown format %s (ckpt, gz, bf16, fp8)\n", fmt.c_str());
      std::exit(2);
    }
  if (f.epochs <= 0) f.epochs = f.cold ? 1 : 2;
  return f;
}

void fail(const std::string& what) {
  throw std::runtime_error(what);
}

fs::path sample_path(const fs::path& dir, int64_t i, const char* ext) {
  return dir / ("rows_" + std::to_string(i / 100 * 100)) / ("data_" + std::to_string(i) + ext);
}

void write_bytes(const fs::path& p, const std::vector<char>& data) {
  std::ofstream out(p, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out.flush()) fail(p.string() + ": write failed");
}

// SpecForge's --compress: zlib's gz* API at level 6.
void write_gzip(const fs::path& p, const std::vector<char>& data) {
  gzFile gz = gzopen(p.c_str(), "wb6");
  if (gz == nullptr) fail(p.string() + ": gzopen failed");
  gzbuffer(gz, 1 << 20);
  size_t done = 0;
  while (done < data.size()) {
    const unsigned n = static_cast<unsigned>(std::min<size_t>(data.size() - done, 1u << 30));
    if (gzwrite(gz, data.data() + done, n) != static_cast<int>(n)) fail(p.string() + ": gzwrite");
    done += n;
  }
  if (gzclose(gz) != Z_OK) fail(p.string() + ": gzclose failed");
}

std::vector<char> sample_bytes(int64_t s, int64_t hidden, at::Generator& gen) {
  c10::Dict<std::string, at::Tensor> d;
  d.insert("input_ids", at::randint(32000, {s}, gen, at::kLong));
  d.insert("loss_mask", at::ones({s}, at::kLong));
  d.insert("hidden_state", at::randn({1, s, hidden}, gen).to(at::kBFloat16));
  d.insert("aux_hidden_state", at::randn({1, s, 3 * hidden}, gen).to(at::kBFloat16));
  return torch_save_bytes(d);
}

// Random features in SpecForge layout (structure does not matter for I/O), as .ckpt and, when
// `gz_dir` is not empty, also as .ckpt.gz; returns the gzip seconds.
double write_features(const Flags& f, const fs::path& dir, const fs::path& gz_dir) {
  const double per_token = 8.0 * static_cast<double>(f.hidden) + 16.0;
  const double avg_len = 0.5 * static_cast<double>(f.min_len + f.max_len);
  // Whole batches, so that one epoch reads every file and MB/s can count all bytes on disk.
  const int64_t n =
      f.batch * std::max<int64_t>(
                    2, static_cast<int64_t>(f.size_mb * kMiB / (per_token * avg_len)) / f.batch);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  double gz_seconds = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = f.min_len + at::randint(f.max_len - f.min_len + 1, {1}, gen).item<int64_t>();
    const auto data = sample_bytes(s, f.hidden, gen);
    const fs::path p = sample_path(dir, i, ".ckpt");
    fs::create_directories(p.parent_path());
    write_bytes(p, data);
    if (!gz_dir.empty()) {
      fsdp::Stopwatch w;
      const fs::path g = sample_path(gz_dir, i, ".ckpt.gz");
      fs::create_directories(g.parent_path());
      write_gzip(g, data);
      gz_seconds += w.seconds();
    }
  }
  return gz_seconds;
}

struct FileSet {
  std::vector<std::string> paths;  // sorted: the order a sequential copy would read them
  uint64_t bytes = 0;
};

FileSet list_files(const fs::path& dir) {
  FileSet s;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) {
      s.paths.push_back(e.path().string());
      s.bytes += e.file_size();
    }
  std::sort(s.paths.begin(), s.paths.end());
  return s;
}

// Share of the file's pages in the page cache (mincore); `pages` gets its page count.
double resident_share(const std::string& p, uint64_t* pages = nullptr) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) fail(p + ": open failed");
  struct stat st {};
  ::fstat(fd, &st);
  const size_t len = static_cast<size_t>(st.st_size);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((len + page - 1) / page);
  uint64_t resident = 0;
  if (len > 0) {
    void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) fail(p + ": mmap failed");
    if (::mincore(m, len, vec.data()) != 0) fail(p + ": mincore failed");
    for (unsigned char v : vec) resident += v & 1;
    ::munmap(m, len);
  }
  ::close(fd);
  if (pages) *pages = vec.size();
  return vec.empty() ? 0.0 : static_cast<double>(resident) / static_cast<double>(vec.size());
}

double resident_share(const FileSet& s) {
  uint64_t pages = 0;
  double resident = 0;
  for (const auto& p : s.paths) {
    uint64_t n = 0;
    resident += resident_share(p, &n) * static_cast<double>(n);
    pages += n;
  }
  return pages == 0 ? 0.0 : resident / static_cast<double>(pages);
}

// Drops the files' pages from the page cache with posix_fadvise(POSIX_FADV_DONTNEED), which
// drops clean pages only: so syncfs first (one writeback for everything just written; an
// fdatasync per file costs a disk flush each), and a file still cached after its drop is
// fdatasync'ed and dropped again. No root needed; directory entries and inodes stay cached.
double drop_from_page_cache(const FileSet& s) {
  fsdp::Stopwatch w;
  auto drop = [](const std::string& p, bool sync) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) fail(p + ": open failed");
    if (sync && ::fdatasync(fd) != 0) fail(p + ": fdatasync failed");
    if (::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) fail(p + ": posix_fadvise failed");
    ::close(fd);
  };
  if (!s.paths.empty()) {
    const int fd = ::open(s.paths.front().c_str(), O_RDONLY);
    if (fd < 0 || ::syncfs(fd) != 0) fail(s.paths.front() + ": syncfs failed");
    ::close(fd);
  }
  for (const auto& p : s.paths) {
    drop(p, false);
    if (resident_share(p) > 0) drop(p, true);
  }
  return w.seconds();
}

// Reads every file once, in order, 1 MiB at a time: what the storage delivers to one reader.
double raw_read_seconds(const FileSet& s) {
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  fsdp::Stopwatch w;
  for (const auto& p : s.paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) fail(p + ": open failed");
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += n;
    ::close(fd);
  }
  const double sec = w.seconds();
  if (total != s.bytes) fail("raw read: short read");
  return sec;
}

struct LoaderResult {
  double seconds = 0, samples_per_s = 0, wait_share = 0;
};

// One epoch per try, from open_feature_dataset to the last batch; the best of f.epochs tries,
// each after a drop when cold.
LoaderResult run_loader(const std::string& path, const FileSet& files, int threads,
                        const Flags& f) {
  LoaderResult best;
  for (int e = 0; e < f.epochs; ++e) {
    if (f.cold) drop_from_page_cache(files);
    fsdp::Stopwatch w;
    auto ds = open_feature_dataset(path);
    LoaderOptions o;
    o.prefetch_threads = threads;
    o.prefetch_depth = 4;
    o.max_length = f.max_len;
    DataLoader loader(ds, DistributedSampler(ds->size(), 0, 1, f.batch, 0), o);
    loader.start({0, 0});
    while (loader.next()) {
    }
    LoaderResult r;
    r.seconds = w.seconds();
    const auto st = loader.stats();
    r.samples_per_s = static_cast<double>(st.samples) / r.seconds;
    r.wait_share = st.data_wait_seconds / r.seconds;
    if (best.seconds == 0 || r.seconds < best.seconds) best = r;
  }
  return best;
}

struct FormatRun {
  std::string name;
  fs::path dir;
  FileSet files;
  double raw_again_seconds = 0, resident_after_drop = 0;
  double raw_seconds[2] = {0, 0};  // the raw read just before each loader run
  LoaderResult loader[2];          // 1 and 2 threads
};

std::string format_label(const std::string& fmt) {
  if (fmt == "gz") return "ckpt.gz";
  if (fmt == "bf16") return "native bf16";
  if (fmt == "fp8") return "native fp8";
  return fmt;
}

void disk_speed_part(const Flags& f, const fs::path& root) {
  if (f.formats.empty()) return;
  const bool want_gz = std::count(f.formats.begin(), f.formats.end(), "gz") > 0;
  fsdp::Stopwatch w;
  const double gz_s = write_features(f, root / "ckpt", want_gz ? root / "gz" : fs::path());
  const FileSet ckpt = list_files(root / "ckpt");
  std::printf("generated %zu samples, %.0f MB of .ckpt (H=%lld, %lld..%lld tokens) in %.1f s",
              ckpt.paths.size(), static_cast<double>(ckpt.bytes) / kMiB,
              static_cast<long long>(f.hidden), static_cast<long long>(f.min_len),
              static_cast<long long>(f.max_len), w.seconds());
  if (want_gz) std::printf(" (of which gzip -6: %.1f s)", gz_s);
  std::printf("\n");
  for (const char* dtype : {"bf16", "fp8"}) {
    if (std::count(f.formats.begin(), f.formats.end(), dtype) == 0) continue;
    ConvertOptions co;
    co.input = (root / "ckpt").string();
    co.output = (root / dtype).string();
    co.shard_bytes = 256ull << 20;
    co.dtype = std::string(dtype) == "fp8" ? "fp8_e4m3" : "bf16";
    const auto rep = convert_to_native(co);
    std::printf("convert --dtype %s: %lld shards in %.1f s (%.0f MB/s written)\n", co.dtype.c_str(),
                static_cast<long long>(rep.shards_total), rep.seconds,
                static_cast<double>(rep.bytes_written) / kMiB / rep.seconds);
  }

  std::vector<FormatRun> runs;
  for (const auto& fmt : f.formats) {
    FormatRun r;
    r.name = format_label(fmt);
    r.dir = root / fmt;
    r.files = list_files(r.dir);
    // Raw read and loader run back to back, so that load from other jobs on a shared disk
    // moves both alike.
    for (int t = 0; t < 2; ++t) {
      if (f.cold) drop_from_page_cache(r.files);
      if (t == 0) r.resident_after_drop = resident_share(r.files);
      r.raw_seconds[t] = raw_read_seconds(r.files);
      if (t == 0) r.raw_again_seconds = raw_read_seconds(r.files);  // now from the page cache
      r.loader[t] = run_loader(r.dir.string(), r.files, t + 1, f);
    }
    runs.push_back(r);
  }
  if (runs.empty()) return;

  std::printf("\n%s page cache%s\n", f.cold ? "COLD" : "WARM",
              f.cold ? ": before every timed read the files were dropped with "
                       "posix_fadvise(POSIX_FADV_DONTNEED)\n after syncfs (fdatasync and again "
                       "for any file still cached)"
                     : " (files just written or read)");
  std::printf("%-12s %7s %9s %7s %7s %9s | %3s %9s %9s %9s %7s %7s\n", "format", "files", "disk MB",
              "vs 1st", "cached", "again", "thr", "raw MB/s", "MB/s", "samples/s", "ld/raw",
              "wait");
  const double ref_bytes = static_cast<double>(runs.front().files.bytes);
  for (const auto& r : runs) {
    const double mb = static_cast<double>(r.files.bytes) / kMiB;
    for (int t = 0; t < 2; ++t) {
      const double raw = mb / r.raw_seconds[t];
      const double ld = mb / r.loader[t].seconds;
      if (t == 0)
        std::printf("%-12s %7zu %9.1f %6.2fx %6.1f%% %9.0f", r.name.c_str(), r.files.paths.size(),
                    mb, static_cast<double>(r.files.bytes) / ref_bytes,
                    100.0 * r.resident_after_drop, mb / r.raw_again_seconds);
      else
        std::printf("%-12s %7s %9s %7s %7s %9s", "", "", "", "", "", "");
      std::printf(" | %3d %9.0f %9.0f %9.1f %6.2fx %6.0f%%\n", t + 1, raw, ld,
                  r.loader[t].samples_per_s, ld / raw, 100.0 * r.loader[t].wait_share);
    }
  }
  const FormatRun* bf16 = nullptr;
  const FormatRun* fp8 = nullptr;
  for (const auto& r : runs) {
    if (r.name == "native bf16") bf16 = &r;
    if (r.name == "native fp8") fp8 = &r;
  }
  if (bf16 && fp8)
    std::printf("fp8 / bf16 bytes on disk: %.3f\n",
                static_cast<double>(fp8->files.bytes) / static_cast<double>(bf16->files.bytes));
  std::printf(
      "(vs 1st: bytes on disk against the first format; cached: share of the files' pages in\n"
      " the page cache before the first raw read (mincore); again: MB/s of a raw read repeated\n"
      " at once (page cache); raw: one reader, files in path order, 1 MiB read()s, just before\n"
      " the loader run of its row; MB/s: the format's bytes on disk / one epoch (shuffled order)\n"
      " from open_feature_dataset to the last batch, no training step; ld/raw: loader MB/s /\n"
      " raw MB/s; wait: consumer time in next())\n");
}

// First-batch latency on a dataset of many tiny .ckpt files: opening must list, not read.
void many_files_part(const Flags& f, const fs::path& root) {
  const fs::path dir = root / "many";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  std::vector<std::vector<char>> pool;  // a few distinct tiny samples, written round-robin
  for (int64_t s = 8; s <= 16; ++s) pool.push_back(sample_bytes(s, 16, gen));
  fsdp::Stopwatch w;
  for (int64_t i = 0; i < f.many_files; ++i) {
    const fs::path p = sample_path(dir, i, ".ckpt");
    if (i % 100 == 0) fs::create_directories(p.parent_path());
    write_bytes(p, pool[static_cast<size_t>(i) % pool.size()]);
  }
  const double gen_s = w.seconds();
  const FileSet files = list_files(dir);
  double drop_s = 0;
  if (f.cold) drop_s = drop_from_page_cache(files);

  w.reset();
  const auto listed = list_ckpt_files(dir.string());
  const double list_s = w.seconds();

  w.reset();
  auto ds = open_feature_dataset(dir.string());
  const double open_s = w.seconds();
  LoaderOptions o;
  o.prefetch_threads = 1;
  o.prefetch_depth = 4;
  o.max_length = f.max_len;
  DataLoader loader(ds, DistributedSampler(ds->size(), 0, 1, f.batch, 0), o);
  loader.start({0, 0});
  const auto first = loader.next();
  const double first_s = w.seconds();
  const int64_t opened = ds->files_opened();
  if (!first || listed.size() != files.paths.size()) fail("many files: no batch or wrong count");

  std::printf("\nmany small files: %lld .ckpt files (S=8..16, H=16, %.1f MB) written in %.1f s",
              static_cast<long long>(f.many_files), static_cast<double>(files.bytes) / kMiB, gen_s);
  if (f.cold) std::printf(", dropped from the page cache (POSIX_FADV_DONTNEED) in %.1f s", drop_s);
  std::printf("\n");
  std::printf("  list_ckpt_files alone:                  %8.3f s (directory entries cached)\n",
              list_s);
  std::printf("  open_feature_dataset:                   %8.3f s\n", open_s);
  std::printf("  open_feature_dataset to first batch:    %8.3f s\n", first_s);
  std::printf(
      "  files opened at the first batch:        %8lld of %lld (batch %lld, prefetch "
      "depth %d, 1 thread)\n",
      static_cast<long long>(opened), static_cast<long long>(f.many_files),
      static_cast<long long>(f.batch), o.prefetch_depth);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines in order with convert's log
  const fs::path root(f.dir);
  fsdp::remove_tree(root.string());
  fs::create_directories(root);
  try {
    disk_speed_part(f, root);
    if (f.many_files > 0) many_files_part(f, root);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_loader_bench: %s\n", e.what());
    if (!f.keep) fsdp::remove_tree(root.string());
    return 1;
  }
  if (!f.keep) fsdp::remove_tree(root.string());
  return 0;
}
