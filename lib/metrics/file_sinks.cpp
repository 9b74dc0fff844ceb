// File sinks (sinks.h): metrics.jsonl and native TensorBoard event files (TFRecord framing with
// masked CRC32C around hand-encoded Event/Summary protobufs). Writes only the scalars given;
// never depends on TensorFlow or protobuf libraries.
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "metrics/sinks.h"

namespace fsdp::metrics {

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Appends `bytes` whole or not at all; on failure (full disk) warns once per failing spell.
void append_whole(std::FILE* f, const std::string& bytes, const std::string& path, bool* failing) {
  const long before = std::ftell(f);
  if (std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0) {
    if (*failing) FSDP_LOG(kInfo) << path << ": writing again";
    *failing = false;
    return;
  }
  const int err = errno;
  std::clearerr(f);
  // Part of it may be on disk: cut the file back so that it holds whole lines/records only.
  if (before >= 0 && ::ftruncate(::fileno(f), before) == 0) std::fseek(f, 0, SEEK_END);
  if (!*failing) {
    FSDP_LOG(kWarn) << path << ": write failed (" << std::strerror(err)
                    << "); metrics are not recorded there until it succeeds again; training "
                       "goes on";
  }
  *failing = true;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses.
uint32_t crc32c(const std::string& data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc(const std::string& data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  put_varint(e, (1 << 3) | 1);
  put_le(e, bits, 8);
  put_varint(e, (2 << 3) | 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

// ---------------------------------------------------------------- metrics.jsonl

namespace {
// Moves the records of steps after `resumed_step` (and a torn last line) out of `path` (JsonlSink).
void supersede_records_after(const std::string& path, int64_t resumed_step) {
  std::ifstream in(path);
  if (!in.good()) return;
  std::string kept, moved, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = !j.is_discarded() && j.is_object() && j.contains("step") &&
                      j["step"].is_number_integer() && j["step"].get<int64_t>() <= resumed_step;
    (keep ? kept : moved) += line + "\n";
  }
  if (moved.empty()) return;
  const std::string stem = path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0
                               ? path.substr(0, path.size() - 6)
                               : path;
  const std::string superseded = stem + ".superseded.jsonl";
  std::FILE* f = std::fopen(superseded.c_str(), "a");
  FSDP_CHECK(
      f && std::fwrite(moved.data(), 1, moved.size(), f) == moved.size() && std::fclose(f) == 0,
      str("cannot write '", superseded, "': ", std::strerror(errno)),
      "check --output-dir and free disk space");
  fsync_file(superseded);
  write_file_durably(path + ".tmp", kept);
  FSDP_CHECK(std::rename((path + ".tmp").c_str(), path.c_str()) == 0,
             str("cannot replace '", path, "': ", std::strerror(errno)),
             "check --output-dir and its permissions");
  FSDP_LOG(kInfo) << path << ": the records after step " << resumed_step << " (from before the "
                  << "resume) moved to " << superseded;
}
}  // namespace

JsonlSink::JsonlSink(const std::string& path, int64_t resumed_step) : path_(path) {
  const std::string dir = parent_dir(path);
  if (!dir.empty()) make_dirs(dir, "check --output-dir and its permissions");
  if (resumed_step >= 0) supersede_records_after(path, resumed_step);
  file_ = std::fopen(path.c_str(), "a");
  FSDP_CHECK(file_ != nullptr, str("cannot open '", path, "' for writing: ", std::strerror(errno)),
             "check --output-dir and free disk space");
  std::setvbuf(file_, nullptr, _IONBF, 0);
}

JsonlSink::~JsonlSink() {
  close();
}

void JsonlSink::log(int64_t step, const Scalars& scalars) {
  if (!file_) return;
  nlohmann::ordered_json j;
  j["step"] = step;
  j["time"] = unix_seconds();
  for (const auto& [k, v] : scalars) j[k] = v;  // NaN/Inf are dumped as null
  append_whole(file_, j.dump() + "\n", path_, &failing_);
}

void JsonlSink::flush() {
  if (file_) std::fflush(file_);
}

void JsonlSink::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

// ---------------------------------------------------------------- TensorBoard

TensorBoardSink::TensorBoardSink(const std::string& dir, int64_t resumed_step) {
  make_dirs(dir, "check --tensorboard-dir (or --output-dir) and its permissions");
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const double t = unix_seconds();
  path_ = str(dir, "/events.out.tfevents.", static_cast<int64_t>(t), ".", host);
  // Two runs started in the same second on one host must not share a file.
  for (int i = 1; ::access(path_.c_str(), F_OK) == 0; ++i) {
    path_ = str(dir, "/events.out.tfevents.", static_cast<int64_t>(t), ".", host, ".", i);
  }
  file_ = std::fopen(path_.c_str(), "wb");
  FSDP_CHECK(file_ != nullptr, str("cannot create '", path_, "': ", std::strerror(errno)),
             "check --tensorboard-dir and the permissions");
  std::setvbuf(file_, nullptr, _IONBF, 0);
  std::string e = event_header(t, 0);
  put_bytes_field(e, 3, "brain.Event:2");
  write_record(e);
  if (resumed_step >= 0) {
    // Event.session_log (7) = SessionLog { status (1) = START (1) }.
    std::string session_log;
    put_varint(session_log, (1 << 3) | 0);
    put_varint(session_log, 1);
    std::string start = event_header(t, resumed_step + 1);
    put_bytes_field(start, 7, session_log);
    write_record(start);
  }
}

TensorBoardSink::~TensorBoardSink() {
  close();
}

void TensorBoardSink::write_record(const std::string& payload) {
  std::string rec;
  std::string len;
  put_le(len, payload.size(), 8);
  rec += len;
  put_le(rec, masked_crc(len), 4);
  rec += payload;
  put_le(rec, masked_crc(payload), 4);
  append_whole(file_, rec, path_, &failing_);
}

void TensorBoardSink::log(int64_t step, const Scalars& scalars) {
  if (!file_) return;
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes_field(v, 1, tag);
    const float f = static_cast<float>(value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    put_varint(v, (2 << 3) | 5);
    put_le(v, bits, 4);
    put_bytes_field(summary, 1, v);
  }
  std::string e = event_header(unix_seconds(), step);
  put_bytes_field(e, 5, summary);
  write_record(e);
}

void TensorBoardSink::flush() {
  if (file_) std::fflush(file_);
}

void TensorBoardSink::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

}  // namespace fsdp::metrics
