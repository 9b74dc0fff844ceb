// Filesystem helpers that must not go through std::filesystem::remove_all: the PyPI torch
// wheel's libtorch.so exports its own incomplete copy of that symbol, which shadows libstdc++'s
// and crashes (null call) when a program linked with LibTorch uses it. Other std::filesystem
// functions were checked and work; use these for recursive removal.
#pragma once

#include <string>

namespace fsdp {

// Removes `path` and everything below it (no error when it does not exist). Does not follow
// symbolic links. Returns false and fills *error when something could not be removed.
bool remove_tree(const std::string& path, std::string* error = nullptr);

}  // namespace fsdp
