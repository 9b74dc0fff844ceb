// Zip structure check (core/zip_check.h). Record layouts: PKWARE APPNOTE 4.3.
#include "core/zip_check.h"

#include <cstdint>

#include "core/error.h"

namespace fsdp {

namespace {
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;

uint64_t le(const std::vector<char>& b, uint64_t pos, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[pos + i]);
  return v;
}
}  // namespace

std::string zip_archive_problem(const std::vector<char>& b) {
  const uint64_t size = b.size();
  if (size < 22) return str("truncated: ", size, " bytes, less than a zip directory record");
  // The end-of-central-directory record: 22 bytes plus a comment of up to 65535 bytes.
  uint64_t eocd = size;
  const uint64_t lowest = size >= 22 + 65535 ? size - 22 - 65535 : 0;
  for (uint64_t p = size - 22 + 1; p-- > lowest;) {
    if (le(b, p, 4) == kEndOfDirectory && p + 22 + le(b, p + 20, 2) == size) {
      eocd = p;
      break;
    }
  }
  if (eocd == size) return "truncated: no end-of-central-directory record (the file ends early)";
  uint64_t entries = le(b, eocd + 10, 2), cd_size = le(b, eocd + 12, 4),
           cd_offset = le(b, eocd + 16, 4);
  uint64_t directory_end = eocd;  // where the central directory must end
  if (eocd >= 20 && le(b, eocd - 20, 4) == kZip64Locator) {
    const uint64_t z = le(b, eocd - 20 + 8, 8);
    if (z > size || z + 56 > eocd - 20 || le(b, z, 4) != kZip64End) return "damaged zip64 directory record";
    entries = le(b, z + 32, 8);
    cd_size = le(b, z + 40, 8);
    cd_offset = le(b, z + 48, 8);
    directory_end = z;
  }
  if (cd_offset > directory_end || cd_size > directory_end - cd_offset)
    return str("damaged: the central directory (", cd_size, " bytes at ", cd_offset,
               ") does not fit before its end record at ", directory_end);
  uint64_t p = cd_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (p + 46 > cd_offset + cd_size || le(b, p, 4) != kCentralHeader)
      return str("damaged: central directory entry ", i, " of ", entries);
    uint64_t comp = le(b, p + 20, 4), local = le(b, p + 42, 4);
    const uint64_t name_len = le(b, p + 28, 2), extra_len = le(b, p + 30, 2),
                   comment_len = le(b, p + 32, 2);
    const uint64_t next = p + 46 + name_len + extra_len + comment_len;
    if (next > cd_offset + cd_size) return str("damaged: central directory entry ", i);
    // Zip64 extended information (header id 1): the 8-byte fields that are 0xFFFFFFFF above,
    // in the order uncompressed size, compressed size, local header offset.
    const bool big_uncomp = le(b, p + 24, 4) == 0xFFFFFFFFu, big_comp = comp == 0xFFFFFFFFu,
               big_local = local == 0xFFFFFFFFu;
    if (big_uncomp || big_comp || big_local) {
      for (uint64_t e = p + 46 + name_len; e + 4 <= p + 46 + name_len + extra_len;) {
        const uint64_t id = le(b, e, 2), len = le(b, e + 2, 2);
        if (e + 4 + len > p + 46 + name_len + extra_len) break;
        if (id == 1) {
          uint64_t f = e + 4;
          if (big_uncomp) f += 8;
          if (big_comp && f + 8 <= e + 4 + len) comp = le(b, f, 8), f += 8;
          if (big_local && f + 8 <= e + 4 + len) local = le(b, f, 8);
        }
        e += 4 + len;
      }
    }
    if (local > cd_offset || cd_offset - local < 30 || le(b, local, 4) != kLocalHeader)
      return str("damaged: entry ", i, "'s local header at ", local, " is missing");
    const uint64_t data = local + 30 + le(b, local + 26, 2) + le(b, local + 28, 2);
    if (data > cd_offset || comp > cd_offset - data)
      return str("truncated: entry ", i, " (", comp, " bytes at ", data,
                 ") runs past the data area");
    p = next;
  }
  return "";
}

}  // namespace fsdp
