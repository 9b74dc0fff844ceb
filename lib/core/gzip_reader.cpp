// Bounded streaming gunzip (gzip_reader.h).
#include "core/gzip_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace fsdp {

namespace {

constexpr size_t kChunk = size_t{1} << 20;

// Pulls input through `next` (returns bytes placed in the buffer, 0 at end of input) and inflates
// all members. `size_hint` (the last member's ISIZE, mod 2^32) only sizes the first allocation.
std::vector<char> inflate_stream(const std::function<size_t(char*, size_t)>& next,
                                 uint64_t size_hint, const GzipLimits& limits) {
  std::vector<char> out;
  out.reserve(static_cast<size_t>(std::min<uint64_t>(size_hint, limits.max_output)));
  std::vector<char> in(kChunk);
  z_stream z{};
  // 16 + MAX_WBITS: a gzip wrapper (header, CRC-32 and ISIZE trailer checked by zlib).
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw FormatError("zlib: cannot initialise");
  struct Guard {
    z_stream* z;
    ~Guard() { inflateEnd(z); }
  } guard{&z};
  bool member_open = false;  // inside a member whose end we have not seen
  bool any_member = false;
  size_t avail = 0;
  const char* pos = in.data();
  for (;;) {
    if (avail == 0) {
      avail = next(in.data(), in.size());
      pos = in.data();
      if (avail == 0) break;
    }
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(pos));
    z.avail_in = static_cast<uInt>(avail);
    while (z.avail_in > 0) {
      member_open = any_member = true;
      if (out.size() == out.capacity() || out.capacity() - out.size() < 4096) {
        const uint64_t grow = std::max<uint64_t>(out.capacity(), kChunk);
        if (out.size() >= limits.max_output)
          throw FormatError(str("expands past the limit of ", limits.max_output, " bytes"));
        out.reserve(
            static_cast<size_t>(std::min<uint64_t>(out.capacity() + grow, limits.max_output + 1)));
      }
      const size_t before = out.size();
      const size_t room = out.capacity() - before;
      out.resize(out.capacity());
      z.next_out = reinterpret_cast<Bytef*>(out.data() + before);
      z.avail_out = static_cast<uInt>(std::min<size_t>(room, 1u << 30));
      const int rc = inflate(&z, Z_NO_FLUSH);
      out.resize(before + (std::min<size_t>(room, 1u << 30) - z.avail_out));
      if (out.size() > limits.max_output)
        throw FormatError(str("expands past the limit of ", limits.max_output, " bytes"));
      if (rc == Z_STREAM_END) {
        member_open = false;
        if (inflateReset(&z) != Z_OK) throw FormatError("zlib: cannot reset");
        continue;  // another member may follow in the remaining input
      }
      if (rc == Z_NEED_DICT || rc == Z_DATA_ERROR)
        throw FormatError(str("corrupt gzip data (", z.msg ? z.msg : "data error", ")"));
      if (rc == Z_MEM_ERROR) throw FormatError("zlib: out of memory");
      if (rc == Z_BUF_ERROR && z.avail_in > 0 && z.avail_out > 0)
        throw FormatError("corrupt gzip data (no progress)");
    }
    avail = 0;
  }
  if (!any_member) throw FormatError("empty file (no gzip member)");
  if (member_open)
    throw FormatError(
        "truncated gzip stream (the file ends inside a member; was it copied whole?)");
  return out;
}

void check_magic(const unsigned char* b, size_t n) {
  if (n < 18) throw FormatError(str("too short for gzip (", n, " bytes)"));
  if (b[0] != 0x1f || b[1] != 0x8b) throw FormatError("not gzip data (no 1f 8b signature)");
}

uint32_t le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace

std::vector<char> gunzip_file(const std::string& path, const GzipLimits& limits,
                              uint64_t* compressed_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ZipIoError(str("cannot open (", std::strerror(errno), ")"), errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw ZipIoError(str("cannot stat (", std::strerror(errno), ")"), errno);
  if (S_ISDIR(st.st_mode))
    throw ZipIoError(str("cannot open (", std::strerror(EISDIR), ")"), EISDIR);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  unsigned char head[18] = {};
  unsigned char tail[4] = {};
  auto pread_all = [&](void* buf, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, static_cast<char*>(buf) + done, n - done, off + done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw ZipIoError(str("read failed (", std::strerror(errno), ")"), errno);
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  };
  const size_t h = pread_all(head, std::min<uint64_t>(size, sizeof(head)), 0);
  check_magic(head, size < 18 ? h : 18);
  pread_all(tail, 4, static_cast<off_t>(size - 4));
  uint64_t offset = 0;
  auto next = [&](char* buf, size_t n) -> size_t {
    const size_t got = pread_all(buf, n, static_cast<off_t>(offset));
    offset += got;
    return got;
  };
  std::vector<char> out = inflate_stream(next, le32(tail), limits);
  if (compressed_bytes) *compressed_bytes = offset;
  return out;
}

std::vector<char> gunzip_bytes(const std::vector<char>& bytes, const GzipLimits& limits) {
  check_magic(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  size_t offset = 0;
  auto next = [&](char* buf, size_t n) -> size_t {
    const size_t got = std::min(n, bytes.size() - offset);
    std::memcpy(buf, bytes.data() + offset, got);
    offset += got;
    return got;
  };
  return inflate_stream(
      next, le32(reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size() - 4), limits);
}

}  // namespace fsdp
