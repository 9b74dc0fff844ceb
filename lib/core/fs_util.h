// Filesystem helpers. Recursive removal must not go through std::filesystem::remove_all: the
// PyPI torch wheel's libtorch.so exports its own incomplete copy of that symbol, which shadows
// libstdc++'s and crashes (null call) when a program linked with LibTorch uses it (other
// std::filesystem functions were checked and work). Durable writes check every write, the fsync
// and the close: an ofstream reports a full disk only when it is closed, which nothing checks.
#pragma once

#include <cstddef>
#include <string>

namespace fsdp {

// Removes `path` and everything below it (no error when it does not exist). Does not follow
// symbolic links. Returns false and fills *error when something could not be removed.
bool remove_tree(const std::string& path, std::string* error = nullptr);

// Creates `dir` and its missing parents (mode 0750); an existing directory is fine. Throws an
// Error naming the part that could not be created, with `hint` as what to do.
void make_dirs(const std::string& dir,
               const std::string& hint = "check the path and its permissions");

// Creates or truncates `path`, writes `size` bytes, fsyncs and closes it; any failure (a full
// disk: ENOSPC, a file size limit: EFBIG) throws an Error naming the file and the reason.
void write_file_durably(const std::string& path, const void* data, size_t size);
inline void write_file_durably(const std::string& path, const std::string& text) {
  write_file_durably(path, text.data(), text.size());
}
// fsyncs an existing file (one an ofstream wrote and closed) or directory (the names renamed
// into it); throws like write_file_durably.
void fsync_file(const std::string& path);

}  // namespace fsdp
