// POSIX recursive removal (core/fs_util.h).
#include "core/fs_util.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

bool remove_tree(const std::string& path, std::string* error) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  g_error = error;
  // FTW_DEPTH: children before their directory; FTW_PHYS: never follow links.
  const int rc = ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  g_error = nullptr;
  return rc == 0;
}

}  // namespace fsdp
