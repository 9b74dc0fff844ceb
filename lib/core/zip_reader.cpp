// Bounded zip reading (core/zip_reader.h). Record layouts: PKWARE APPNOTE 4.3.
#include "core/zip_reader.h"
#include "core/error.h"  // fsdp::str (header-only)

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace fsdp {

namespace {
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;

// Bytes [base, base + bytes.size()) of the archive, read once and addressed by archive offset.
struct Window {
  uint64_t base = 0;
  std::vector<char> bytes;
  // Little-endian field of n bytes at archive offset pos; the caller has checked that the field
  // lies inside the window.
  uint64_t le(uint64_t pos, int n) const {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i)
      v = (v << 8) | static_cast<unsigned char>(bytes[pos - base + i]);
    return v;
  }
};

// The end-of-central-directory record (22 bytes plus a comment of up to 65535 bytes) is searched
// backwards from the end, first in the last kTailGuess bytes (torch.save writes no comment),
// then in the whole range a comment allows: the same record is found either way.
constexpr uint64_t kTailGuess = 22 + 1024;

uint32_t crc_of(const char* p, uint64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}
}  // namespace

void MemorySource::read(uint64_t offset, uint64_t n, char* out) const {
  if (n > 0) std::memcpy(out, bytes_.data() + offset, n);
}

FileSource::FileSource(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw ZipIoError(str("cannot open (", std::strerror(errno), ")"), errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw ZipIoError(str("cannot stat (", std::strerror(err), ")"), err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    throw ZipIoError(str("cannot open (", std::strerror(EISDIR), ")"), EISDIR);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

FileSource::~FileSource() {
  if (fd_ >= 0) ::close(fd_);
}

void FileSource::read(uint64_t offset, uint64_t n, char* out) const {
  while (n > 0) {
    const ssize_t got =
        ::pread(fd_, out, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw ZipIoError(str("read failed (", std::strerror(errno), ")"), errno);
    // The file shrank since it was opened: a read error, not a damaged archive.
    if (got == 0) throw ZipIoError(str("read failed (the file ends at ", offset, ")"), EIO);
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
    bytes_read_ += static_cast<uint64_t>(got);
  }
}

ZipArchive::ZipArchive(const std::vector<char>& bytes, ZipLimits limits)
    : memory_(std::make_unique<MemorySource>(bytes)), source_(*memory_), limits_(limits) {
  parse();
}

ZipArchive::ZipArchive(const ZipSource& source, ZipLimits limits)
    : source_(source), limits_(limits) {
  parse();
}

std::vector<char> ZipArchive::fetch(uint64_t offset, uint64_t n) const {
  std::vector<char> out(n);
  source_.read(offset, n, out.data());
  return out;
}

ZipArchive::Directory ZipArchive::locate_directory() const {
  const uint64_t size = source_.size();
  if (size < 22)
    throw FormatError(str("truncated: ", size, " bytes, less than a zip directory record"));
  // The end-of-central-directory record: 22 bytes plus a comment of up to 65535 bytes.
  uint64_t eocd = size;
  Window tail;
  for (const uint64_t span : {kTailGuess, uint64_t{22 + 65535}}) {
    const uint64_t lowest = size >= span ? size - span : 0;
    if (span > kTailGuess && tail.base == 0) break;  // the first window held the whole file
    tail = {lowest, fetch(lowest, size - lowest)};
    for (uint64_t p = size - 22 + 1; p-- > lowest;) {
      if (tail.le(p, 4) == kEndOfDirectory && p + 22 + tail.le(p + 20, 2) == size) {
        eocd = p;
        break;
      }
    }
    if (eocd != size) break;
  }
  if (eocd == size)
    throw FormatError("truncated: no end-of-central-directory record (the file ends early)");
  Directory d{tail.le(eocd + 10, 2), tail.le(eocd + 12, 4), tail.le(eocd + 16, 4)};
  uint64_t directory_end = eocd;  // where the central directory must end
  const Window locator = eocd >= 20 ? Window{eocd - 20, fetch(eocd - 20, 20)} : Window{};
  if (eocd >= 20 && locator.le(eocd - 20, 4) == kZip64Locator) {
    const uint64_t z = locator.le(eocd - 20 + 8, 8);
    if (z > size || z + 56 > eocd - 20) throw FormatError("damaged zip64 directory record");
    const Window record{z, fetch(z, 56)};
    if (record.le(z, 4) != kZip64End) throw FormatError("damaged zip64 directory record");
    d = {record.le(z + 32, 8), record.le(z + 40, 8), record.le(z + 48, 8)};
    directory_end = z;
  }
  if (d.offset > directory_end || d.size > directory_end - d.offset)
    throw FormatError(str("damaged: the central directory (", d.size, " bytes at ", d.offset,
                          ") does not fit before its end record at ", directory_end));
  return d;
}

void ZipArchive::parse() {
  const Directory d = locate_directory();
  const uint64_t entries = d.entries, cd_size = d.size, cd_offset = d.offset;
  // Each central entry takes at least 46 bytes: a count that cannot fit is caught before any
  // allocation sized by it.
  if (entries > cd_size / 46 || entries > limits_.max_entries)
    throw FormatError(str("damaged: the directory claims ", entries, " entries in ", cd_size,
                          " bytes (at most ", limits_.max_entries, " are read)"));
  entries_.reserve(entries);
  const Window b{cd_offset, fetch(cd_offset, cd_size)};
  uint64_t p = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (p + 46 > cd_end || b.le(p, 4) != kCentralHeader)
      throw FormatError(str("damaged: central directory entry ", i, " of ", entries));
    ZipEntry e;
    const uint64_t flags = b.le(p + 8, 2);
    e.method = static_cast<uint16_t>(b.le(p + 10, 2));
    e.crc32 = static_cast<uint32_t>(b.le(p + 16, 4));
    e.compressed = b.le(p + 20, 4);
    e.uncompressed = b.le(p + 24, 4);
    uint64_t local = b.le(p + 42, 4);
    const uint64_t name_len = b.le(p + 28, 2), extra_len = b.le(p + 30, 2),
                   comment_len = b.le(p + 32, 2);
    const uint64_t next = p + 46 + name_len + extra_len + comment_len;
    if (next > cd_end) throw FormatError(str("damaged: central directory entry ", i));
    e.name.assign(b.bytes.data() + (p - b.base) + 46, name_len);
    if (flags & 1u) throw FormatError(str("entry '", e.name, "' is encrypted"));
    // Zip64 extended information (header id 1): the 8-byte fields that are 0xFFFFFFFF above,
    // in the order uncompressed size, compressed size, local header offset.
    const bool big_uncomp = e.uncompressed == 0xFFFFFFFFu, big_comp = e.compressed == 0xFFFFFFFFu,
               big_local = local == 0xFFFFFFFFu;
    if (big_uncomp || big_comp || big_local) {
      const uint64_t extra_end = p + 46 + name_len + extra_len;
      for (uint64_t x = p + 46 + name_len; x + 4 <= extra_end;) {
        const uint64_t id = b.le(x, 2), len = b.le(x + 2, 2);
        if (x + 4 + len > extra_end) break;
        if (id == 1) {
          uint64_t f = x + 4;
          const uint64_t f_end = x + 4 + len;
          if (big_uncomp && f + 8 <= f_end) e.uncompressed = b.le(f, 8), f += 8;
          if (big_comp && f + 8 <= f_end) e.compressed = b.le(f, 8), f += 8;
          if (big_local && f + 8 <= f_end) local = b.le(f, 8);
        }
        x += 4 + len;
      }
    }
    const bool room = local <= cd_offset && cd_offset - local >= 30;
    const Window header = room ? Window{local, fetch(local, 30)} : Window{};
    if (!room || header.le(local, 4) != kLocalHeader)
      throw FormatError(str("damaged: entry ", i, "'s local header at ", local, " is missing"));
    e.data_offset = local + 30 + header.le(local + 26, 2) + header.le(local + 28, 2);
    if (e.data_offset > cd_offset || e.compressed > cd_offset - e.data_offset)
      throw FormatError(str("truncated: entry ", i, " (", e.compressed, " bytes at ", e.data_offset,
                            ") runs past the data area"));
    if (e.method == 0) {
      if (e.uncompressed != e.compressed)
        throw FormatError(str("damaged: stored entry '", e.name, "' declares ", e.uncompressed,
                              " bytes but holds ", e.compressed));
    } else if (e.method == 8) {
      const uint64_t ceiling =
          e.compressed > (std::numeric_limits<uint64_t>::max() - limits_.expansion_slack) /
                             limits_.max_expansion_ratio
              ? std::numeric_limits<uint64_t>::max()
              : e.compressed * limits_.max_expansion_ratio + limits_.expansion_slack;
      if (e.uncompressed > ceiling)
        throw FormatError(str("entry '", e.name, "' declares ", e.uncompressed, " bytes from ",
                              e.compressed, " compressed (more than ", limits_.max_expansion_ratio,
                              "x + ", limits_.expansion_slack, " bytes): refused as a zip bomb"));
    } else {
      throw FormatError(str("entry '", e.name, "' uses compression method ", e.method,
                            " (only stored and deflate are read)"));
    }
    if (!index_.emplace(e.name, entries_.size()).second)
      throw FormatError(str("two entries named '", e.name, "'"));
    entries_.push_back(std::move(e));
    p = next;
  }
}

const ZipEntry* ZipArchive::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void ZipArchive::read_into(const ZipEntry& e, char* out) const {
  if (e.method == 0) {
    source_.read(e.data_offset, e.uncompressed, out);
  } else {
    const std::vector<char> compressed = fetch(e.data_offset, e.compressed);
    const char* src = compressed.data();
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw FormatError("zlib: cannot initialise inflate");
    uint64_t in_left = e.compressed, out_done = 0;
    int rc = Z_OK;
    const char* in = src;
    while (rc != Z_STREAM_END) {
      if (z.avail_in == 0 && in_left > 0) {
        const uInt n = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
        z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in));
        z.avail_in = n;
        in += n;
        in_left -= n;
      }
      // One spare byte past the declared size detects a stream that expands further.
      unsigned char spare = 0;
      const uint64_t room = e.uncompressed - out_done;
      if (room > 0) {
        z.next_out = reinterpret_cast<Bytef*>(out + out_done);
        z.avail_out = static_cast<uInt>(std::min<uint64_t>(room, 1u << 30));
      } else {
        z.next_out = &spare;
        z.avail_out = 1;
      }
      const uInt before = z.avail_out;
      rc = inflate(&z, Z_NO_FLUSH);
      const uInt produced = before - z.avail_out;
      if (room == 0 && produced > 0) {
        inflateEnd(&z);
        throw FormatError(str("entry '", e.name, "' expands past its declared ", e.uncompressed,
                              " bytes: refused"));
      }
      out_done += produced;
      if (rc == Z_STREAM_END) break;
      if (rc != Z_OK && !(rc == Z_BUF_ERROR && (z.avail_in > 0 || in_left > 0))) {
        inflateEnd(&z);
        throw FormatError(
            str("entry '", e.name, "': bad deflate stream (", z.msg ? z.msg : "truncated", ")"));
      }
    }
    inflateEnd(&z);
    if (out_done != e.uncompressed)
      throw FormatError(
          str("entry '", e.name, "' expands to ", out_done, " bytes, declared ", e.uncompressed));
  }
  const uint32_t crc = crc_of(out, e.uncompressed);
  if (crc != e.crc32)
    throw FormatError(str("entry '", e.name, "' fails its CRC-32 check (damaged bytes)"));
}

std::vector<char> ZipArchive::read(const ZipEntry& e) const {
  std::vector<char> out(e.uncompressed);
  read_into(e, out.data());
  return out;
}

std::string zip_archive_problem(const std::vector<char>& bytes) {
  try {
    ZipArchive archive(bytes);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

}  // namespace fsdp
