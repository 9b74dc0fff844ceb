// POSIX recursive removal (core/fs_util.h).
#include "core/fs_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace fsdp {

namespace {
thread_local std::string* g_error = nullptr;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0 && errno != ENOENT) {
    if (g_error) *g_error = std::string(path) + ": " + std::strerror(errno);
    return -1;
  }
  return 0;
}
}  // namespace

void make_dirs(const std::string& dir, const std::string& hint) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos < dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0750) != 0 && errno != EEXIST) {
      // Mostly a path the user gave (a file where a directory is needed, permissions): a usage
      // error (exit code 2); the save path catches it like any write error.
      FSDP_USAGE_FAIL(str("cannot create directory '", part, "': ", std::strerror(errno)), hint);
    }
  }
}

bool remove_tree(const std::string& path, std::string* error) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  g_error = error;
  // FTW_DEPTH: children before their directory; FTW_PHYS: never follow links.
  const int rc = ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  g_error = nullptr;
  return rc == 0;
}

void write_file_durably(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  FSDP_CHECK(fd >= 0, path + ": cannot create (" + std::strerror(errno) + ")",
             "check that the directory exists and is writable");
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "no progress";
      ::close(fd);
      FSDP_FAIL(path + ": write failed (" + why + ")", "check free disk space");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    FSDP_FAIL(path + ": fsync failed (" + why + ")", "check free disk space");
  }
  FSDP_CHECK(::close(fd) == 0, path + ": close failed (" + std::strerror(errno) + ")",
             "check free disk space");
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, path + ": cannot open to fsync (" + std::strerror(errno) + ")",
             "check that the file still exists and that you may read it");
  const bool ok = ::fsync(fd) == 0;
  const std::string why = ok ? "" : std::strerror(errno);
  ::close(fd);
  FSDP_CHECK(ok, path + ": fsync failed (" + why + ")", "check free disk space");
}

}  // namespace fsdp
