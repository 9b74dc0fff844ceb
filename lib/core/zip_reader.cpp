// Bounded zip reading (core/zip_reader.h). Record layouts: PKWARE APPNOTE 4.3.
#include "core/error.h"  // fsdp::str (header-only)
#include "core/zip_reader.h"

#include <zlib.h>

#include <cstring>
#include <limits>

namespace fsdp {

namespace {
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;

// Little-endian field of n bytes at pos; the caller has checked pos + n <= size.
uint64_t le(const std::vector<char>& b, uint64_t pos, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[pos + i]);
  return v;
}

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

ZipArchive::ZipArchive(const std::vector<char>& b, ZipLimits limits) : bytes_(b), limits_(limits) {
  const uint64_t size = b.size();
  if (size < 22) throw FormatError(str("truncated: ", size, " bytes, less than a zip directory record"));
  // The end-of-central-directory record: 22 bytes plus a comment of up to 65535 bytes.
  uint64_t eocd = size;
  const uint64_t lowest = size >= 22 + 65535 ? size - 22 - 65535 : 0;
  for (uint64_t p = size - 22 + 1; p-- > lowest;) {
    if (le(b, p, 4) == kEndOfDirectory && p + 22 + le(b, p + 20, 2) == size) {
      eocd = p;
      break;
    }
  }
  if (eocd == size) throw FormatError("truncated: no end-of-central-directory record (the file ends early)");
  uint64_t entries = le(b, eocd + 10, 2), cd_size = le(b, eocd + 12, 4),
           cd_offset = le(b, eocd + 16, 4);
  uint64_t directory_end = eocd;  // where the central directory must end
  if (eocd >= 20 && le(b, eocd - 20, 4) == kZip64Locator) {
    const uint64_t z = le(b, eocd - 20 + 8, 8);
    if (z > size || z + 56 > eocd - 20 || le(b, z, 4) != kZip64End)
      throw FormatError("damaged zip64 directory record");
    entries = le(b, z + 32, 8);
    cd_size = le(b, z + 40, 8);
    cd_offset = le(b, z + 48, 8);
    directory_end = z;
  }
  if (cd_offset > directory_end || cd_size > directory_end - cd_offset)
    throw FormatError(str("damaged: the central directory (", cd_size, " bytes at ", cd_offset,
                          ") does not fit before its end record at ", directory_end));
  // Each central entry takes at least 46 bytes: a count that cannot fit is caught before any
  // allocation sized by it.
  if (entries > cd_size / 46 || entries > limits_.max_entries)
    throw FormatError(str("damaged: the directory claims ", entries, " entries in ", cd_size,
                          " bytes (at most ", limits_.max_entries, " are read)"));
  entries_.reserve(entries);
  uint64_t p = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (p + 46 > cd_end || le(b, p, 4) != kCentralHeader)
      throw FormatError(str("damaged: central directory entry ", i, " of ", entries));
    ZipEntry e;
    const uint64_t flags = le(b, p + 8, 2);
    e.method = static_cast<uint16_t>(le(b, p + 10, 2));
    e.crc32 = static_cast<uint32_t>(le(b, p + 16, 4));
    e.compressed = le(b, p + 20, 4);
    e.uncompressed = le(b, p + 24, 4);
    uint64_t local = le(b, p + 42, 4);
    const uint64_t name_len = le(b, p + 28, 2), extra_len = le(b, p + 30, 2),
                   comment_len = le(b, p + 32, 2);
    const uint64_t next = p + 46 + name_len + extra_len + comment_len;
    if (next > cd_end) throw FormatError(str("damaged: central directory entry ", i));
    e.name.assign(b.data() + p + 46, name_len);
    if (flags & 1u) throw FormatError(str("entry '", e.name, "' is encrypted"));
    // Zip64 extended information (header id 1): the 8-byte fields that are 0xFFFFFFFF above,
    // in the order uncompressed size, compressed size, local header offset.
    const bool big_uncomp = e.uncompressed == 0xFFFFFFFFu, big_comp = e.compressed == 0xFFFFFFFFu,
               big_local = local == 0xFFFFFFFFu;
    if (big_uncomp || big_comp || big_local) {
      const uint64_t extra_end = p + 46 + name_len + extra_len;
      for (uint64_t x = p + 46 + name_len; x + 4 <= extra_end;) {
        const uint64_t id = le(b, x, 2), len = le(b, x + 2, 2);
        if (x + 4 + len > extra_end) break;
        if (id == 1) {
          uint64_t f = x + 4;
          const uint64_t f_end = x + 4 + len;
          if (big_uncomp && f + 8 <= f_end) e.uncompressed = le(b, f, 8), f += 8;
          if (big_comp && f + 8 <= f_end) e.compressed = le(b, f, 8), f += 8;
          if (big_local && f + 8 <= f_end) local = le(b, f, 8);
        }
        x += 4 + len;
      }
    }
    if (local > cd_offset || cd_offset - local < 30 || le(b, local, 4) != kLocalHeader)
      throw FormatError(str("damaged: entry ", i, "'s local header at ", local, " is missing"));
    e.data_offset = local + 30 + le(b, local + 26, 2) + le(b, local + 28, 2);
    if (e.data_offset > cd_offset || e.compressed > cd_offset - e.data_offset)
      throw FormatError(str("truncated: entry ", i, " (", e.compressed, " bytes at ", e.data_offset,
                            ") runs past the data area"));
    if (e.method == 0) {
      if (e.uncompressed != e.compressed)
        throw FormatError(str("damaged: stored entry '", e.name, "' declares ", e.uncompressed,
                              " bytes but holds ", e.compressed));
    } else if (e.method == 8) {
      const uint64_t ceiling = e.compressed > (std::numeric_limits<uint64_t>::max() -
                                               limits_.expansion_slack) / limits_.max_expansion_ratio
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
  const char* src = bytes_.data() + e.data_offset;
  if (e.method == 0) {
    if (e.uncompressed > 0) std::memcpy(out, src, e.uncompressed);
  } else {
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
        throw FormatError(str("entry '", e.name, "': bad deflate stream (", z.msg ? z.msg : "truncated", ")"));
      }
    }
    inflateEnd(&z);
    if (out_done != e.uncompressed)
      throw FormatError(str("entry '", e.name, "' expands to ", out_done, " bytes, declared ",
                            e.uncompressed));
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
