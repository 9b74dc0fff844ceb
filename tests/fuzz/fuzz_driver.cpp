// A seeded mutational fuzzer over the readers of untrusted input (targets.h): torch.save
// archives (pure reader, then LibTorch tensors), safetensors headers, draft configs (JSON) and
// run configs (YAML). Deterministic for a given --seed; the suite runs it for a fixed budget
// (tests/CMakeLists.txt), longer runs are documented in docs/security.md.
//   fuzz_driver [--target NAME|all] [--seconds S] [--iterations N] [--seed K] [--save DIR]
// A crash, a sanitizer report or an exception other than the reader's documented error type is a
// finding: the input is written to DIR/finding-<target>-<iteration> (on a fatal signal too) and
// the driver exits non-zero.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <zlib.h>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>

#include "checkpoint/safetensors.h"
#include "config/options.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/gzip_reader.h"
#include "core/log.h"
#include "core/torch_archive_load.h"
#include "data/arrow_ipc.h"
#include "model/draft_config.h"
#include "support/test_paths.h"
#include "targets.h"
#include "unit/data/arrow_test_bytes.h"

namespace fsdp::fuzz {
namespace {

// Accepting or failing with fsdp::Error (every user-facing reader error) / FormatError is fine.
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const fsdp::Error&) {
  } catch (const FormatError&) {
  }
}

void run_archive_tensors(const uint8_t* data, size_t size) {
  expect_clean([&] { load_torch_archive(std::vector<char>(data, data + size)); });
}

void run_safetensors_header(const uint8_t* data, size_t size) {
  expect_clean([&] {
    std::map<std::string, std::string> metadata;
    checkpoint::parse_safetensors_header(std::string(data, data + size), 8 + size, 8 + size + 4096,
                                         "<fuzz>", &metadata);
  });
}

void run_draft_config(const uint8_t* data, size_t size) {
  expect_clean([&] { model::parse_draft_config(std::string(data, data + size), "<fuzz>"); });
}

void run_yaml_config(const uint8_t* data, size_t size) {
  expect_clean([&] {
    config::TrainConfig cfg;
    config::apply_yaml_text(std::string(data, data + size), "<fuzz>", &cfg);
  });
}

// SpecForge --compress files: gunzip with a small ceiling (a mutated length must not allocate
// without bound), then the archive reader on what came out.
void run_gzip(const uint8_t* data, size_t size) {
  expect_clean([&] {
    GzipLimits limits;
    limits.max_output = 1 << 24;
    const std::vector<char> out = gunzip_bytes(std::vector<char>(data, data + size), limits);
    load_torch_archive(out);
  });
}

// speculators' loss masks: the Arrow IPC stream reader, every row of every column read.
void run_arrow(const uint8_t* data, size_t size) {
  expect_clean([&] {
    auto f = data::ArrowStreamFile::from_bytes(std::string(data, data + size), "<fuzz>");
    for (int c = 0; c < f->num_columns(); ++c) {
      for (int64_t r = 0; r < f->num_rows(); ++r) {
        expect_clean([&] { f->int_list(c, r); });
        expect_clean([&] { f->int_value(c, r); });
      }
    }
  });
}

std::vector<std::string> gzip_seeds() {
  std::vector<std::string> out;
  for (const std::string& archive : torch_archive_seeds()) {
    // A stored (level 0) gzip member: valid gzip without zlib's deflate in the test binary.
    std::string g = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, 3};
    const uint16_t n = static_cast<uint16_t>(archive.size());
    g += std::string{1, static_cast<char>(n & 0xff), static_cast<char>(n >> 8),
                     static_cast<char>(~n & 0xff), static_cast<char>((~n >> 8) & 0xff)};
    g += archive;
    const uint32_t crc = static_cast<uint32_t>(
        ::crc32(0, reinterpret_cast<const unsigned char*>(archive.data()), archive.size()));
    for (int i = 0; i < 4; ++i) g.push_back(static_cast<char>(crc >> (8 * i)));
    for (int i = 0; i < 4; ++i) g.push_back(static_cast<char>(archive.size() >> (8 * i)));
    out.push_back(g);
  }
  return out;
}

std::vector<std::string> arrow_seeds() {
  using data::testing::from_hex;
  return {from_hex(data::testing::kGoodStream), from_hex(data::testing::kBadStream)};
}

std::vector<std::string> safetensors_seeds() {
  return {
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})"};
}
std::vector<std::string> draft_config_seeds() {
  std::ifstream in(std::string(FSDP_SOURCE_DIR) + "/configs/models/llama3-8B-eagle3.json");
  return {std::string(std::istreambuf_iterator<char>(in), {})};
}
std::vector<std::string> yaml_seeds() {
  return {
      "train-hidden-states-path: /data/hs\nlearning-rate: 1e-4\nnum-epochs: 2\n"
      "sharding-strategy: FULL_SHARD\nmax-length: 2048\nbatch-size: 1\nseed: 7\n"
      "report-to: [tensorboard]\n"};
}

const Target kTargets[] = {
    {"torch_archive", run_torch_archive, torch_archive_seeds},
    {"archive_tensors", run_archive_tensors, torch_archive_seeds},
    {"safetensors_header", run_safetensors_header, safetensors_seeds},
    {"draft_config", run_draft_config, draft_config_seeds},
    {"yaml_config", run_yaml_config, yaml_seeds},
    {"gzip_ckpt", run_gzip, gzip_seeds},
    {"arrow_stream", run_arrow, arrow_seeds},
};

std::string g_save_dir = ".";
const std::string* g_current = nullptr;
std::string g_current_name;

void on_fatal(int sig) {
  if (g_current) {
    const std::string path = g_save_dir + "/" + g_current_name;
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0640);
    if (fd >= 0) {
      const ssize_t w = ::write(fd, g_current->data(), g_current->size());
      (void)w;
      ::close(fd);
    }
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

uint64_t interesting(std::mt19937_64& rng) {
  static const uint64_t kValues[] = {
      0,          1,          0x7f,       0x80,       0xff,  0x7fff,     0xffff,
      0x7fffffff, 0x80000000, 0xffffffff, 1ull << 40, ~0ull, 1ull << 63, (1ull << 63) - 1};
  return kValues[rng() % (sizeof(kValues) / sizeof(kValues[0]))];
}

std::string mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  std::string s = seeds[rng() % seeds.size()];
  const int n = 1 + static_cast<int>(rng() % 6);
  for (int m = 0; m < n; ++m) {
    const size_t pos = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 8) {
      case 0:
        if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1u << (rng() % 8)));
        break;
      case 1:
        if (!s.empty()) s[pos] = static_cast<char>(rng());
        break;
      case 2: {  // an interesting little-endian integer of 1, 2, 4 or 8 bytes
        const int w = 1 << (rng() % 4);
        const uint64_t v = interesting(rng);
        for (int i = 0; i < w && pos + i < s.size(); ++i)
          s[pos + i] = static_cast<char>(v >> (8 * i));
        break;
      }
      case 3:
        s.erase(pos, rng() % 64);
        break;
      case 4:
        if (!s.empty()) s.insert(pos, s.substr(rng() % s.size(), rng() % 64));
        break;
      case 5:
        s.resize(pos);
        break;
      case 6: {  // decimal digits: numbers in text formats
        static const char* kNums[] = {"0",     "-1", "999999999999999999999",
                                      "1e308", "-0", "18446744073709551616",
                                      "nan",   "[",  "{",
                                      "\"",    ":"};
        s.insert(pos, kNums[rng() % (sizeof(kNums) / sizeof(kNums[0]))]);
        break;
      }
      default: {  // splice with another seed
        const std::string& o = seeds[rng() % seeds.size()];
        if (!o.empty()) s = s.substr(0, pos) + o.substr(rng() % o.size());
      }
    }
  }
  return s;
}

}  // namespace
}  // namespace fsdp::fuzz

int main(int argc, char** argv) {
  using namespace fsdp::fuzz;
  std::string which = "all";
  double seconds = 10;
  long long iterations = -1;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--target")
      which = v;
    else if (a == "--seconds")
      seconds = std::stod(v);
    else if (a == "--iterations")
      iterations = std::stoll(v);
    else if (a == "--seed")
      seed = std::stoull(v);
    else if (a == "--save")
      g_save_dir = v;
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL}) std::signal(sig, on_fatal);
  fsdp::log::set_level(fsdp::log::Level::kOff);
  int ran = 0;
  for (const Target& t : kTargets) {
    if (which != "all" && which != t.name) continue;
    ++ran;
    const std::vector<std::string> seeds = t.seeds();
    std::mt19937_64 rng(seed);
    const auto start = std::chrono::steady_clock::now();
    long long n = 0;
    for (const std::string& s : seeds) t.run(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    while (iterations >= 0
               ? n < iterations
               : std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
                     seconds) {
      const std::string input = mutate(seeds, rng);
      g_current = &input;
      g_current_name = std::string("finding-") + t.name + "-" + std::to_string(n);
      try {
        t.run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
      } catch (const std::exception& e) {
        std::ofstream(g_save_dir + "/" + g_current_name, std::ios::binary) << input;
        std::cerr << "FINDING " << t.name << " iteration " << n << " (seed " << seed
                  << "): unexpected exception: " << e.what() << "\n";
        return 1;
      }
      ++n;
    }
    g_current = nullptr;
    std::cout << "fuzz " << t.name << ": " << n << " inputs, seed " << seed << ", no findings\n";
  }
  if (ran == 0) {
    std::cerr << "no target named " << which << "\n";
    return 2;
  }
  return 0;
}
