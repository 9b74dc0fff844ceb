// A bounded reader of zip archives held in memory or read from a file range by range (the
// container of torch.save files and of our training-state shards). Every record (end of directory,
// zip64 records, central directory, local headers, data ranges) is checked against the buffer
// before it is used, entries are expanded at most once per read into a buffer of their declared
// size, and every entry's CRC-32 is verified. Never reads outside the buffer, never trusts a size
// it has not checked; pure C++ (no LibTorch), so the fuzz targets build it alone (tests/fuzz).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fsdp {

// A malformed or hostile file: what is wrong, without the file's name (callers add it).
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Ceilings on what one archive may declare or expand to (docs/security.md, "Limits").
struct ZipLimits {
  uint64_t max_entries = 1u << 16;
  // A deflated entry may expand to at most ratio x its compressed size + slack bytes (and never
  // beyond its declared size). torch.save never compresses; deflate's own maximum is ~1032x.
  uint64_t max_expansion_ratio = 100;
  uint64_t expansion_slack = 1u << 20;
};

struct ZipEntry {
  std::string name;
  uint16_t method = 0;        // 0 stored, 8 deflated; others are refused when parsed
  uint64_t compressed = 0;    // bytes in the archive
  uint64_t uncompressed = 0;  // declared expanded size
  uint32_t crc32 = 0;         // declared CRC-32 of the expanded bytes
  uint64_t data_offset = 0;   // where the compressed bytes start in the buffer
};

// Where an archive's bytes are: all in memory, or in a file read range by range, so that a
// reader needing two of an archive's records never reads the others.
class ZipSource {
 public:
  virtual ~ZipSource() = default;
  virtual uint64_t size() const = 0;
  // Copies bytes [offset, offset + n) to `out`; the caller has checked the range against size().
  virtual void read(uint64_t offset, uint64_t n, char* out) const = 0;
};

class MemorySource final : public ZipSource {
 public:
  explicit MemorySource(const std::vector<char>& bytes) : bytes_(bytes) {}  // kept by reference
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, uint64_t n, char* out) const override;

 private:
  const std::vector<char>& bytes_;
};

// The file could not be opened or read (not: its content is wrong); `error_number` is errno, so
// callers can tell a missing file from a failing file system.
class ZipIoError : public std::runtime_error {
 public:
  ZipIoError(const std::string& what, int error_number)
      : std::runtime_error(what), error_number(error_number) {}
  int error_number;
};

// A file read with pread, only the ranges asked for. Throws ZipIoError.
class FileSource final : public ZipSource {
 public:
  explicit FileSource(const std::string& path);
  ~FileSource() override;
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, uint64_t n, char* out) const override;
  // Bytes read from the file so far (what a test or a measurement of laziness needs).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  mutable uint64_t bytes_read_ = 0;
};

class ZipArchive {
 public:
  // Parses and checks the directory of `bytes` (kept by reference: it must outlive this object).
  // Throws FormatError, e.g. "truncated: no end-of-central-directory record (the file ends
  // early)".
  explicit ZipArchive(const std::vector<char>& bytes, ZipLimits limits = {});
  // Same over any source (kept by reference): only the directory records are read here, an
  // entry's bytes only by read_into.
  explicit ZipArchive(const ZipSource& source, ZipLimits limits = {});

  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The entry named exactly `name`, or nullptr.
  const ZipEntry* find(std::string_view name) const;

  // The entry's expanded bytes written to `out` (which must hold entry.uncompressed bytes), CRC
  // checked. Throws FormatError naming the entry on a bad CRC, a bad deflate stream or an
  // expansion past the declared size.
  void read_into(const ZipEntry& entry, char* out) const;
  std::vector<char> read(const ZipEntry& entry) const;

 private:
  // The central directory as its end record (or zip64 end record) declares it, checked to lie
  // before that record.
  struct Directory {
    uint64_t entries = 0, size = 0, offset = 0;
  };
  Directory locate_directory() const;
  void parse();
  // Bytes [offset, offset + n) of the source; the caller has checked the range.
  std::vector<char> fetch(uint64_t offset, uint64_t n) const;

  std::unique_ptr<MemorySource> memory_;  // the vector constructor's source
  const ZipSource& source_;
  ZipLimits limits_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// "" when `bytes` parse as a zip archive (directory only, no CRC check), else the problem.
std::string zip_archive_problem(const std::vector<char>& bytes);

}  // namespace fsdp
