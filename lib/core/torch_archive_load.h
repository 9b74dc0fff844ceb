// LibTorch values from a checked torch.save archive (core/torch_archive.h): what replaces
// torch::pickle_load for feature files, vocabulary mappings and training-state shards.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "core/torch_archive.h"

namespace fsdp {

// The archive's object as an IValue: dicts (string, int or bool keys), lists and tuples
// (as lists), strings, ints, floats, bools, None and CPU tensors. Every storage record is read
// (and CRC checked) once, straight into the tensor's memory; tensors sharing a storage share it.
// Throws FormatError (callers add the file's name and a hint).
c10::IValue load_torch_archive(const std::vector<char>& bytes, const ArchiveLimits& limits = {});

// Only the values of the archive's top-level dict under the string keys in `keys` (a key the
// dict lacks is absent from the result): the other values are never built and their storages
// never read, so over a FileSource only the records needed are read. Throws FormatError when
// the archive's object is not a dict.
c10::impl::GenericDict load_torch_archive_keys(const TorchArchive& archive,
                                               const std::vector<std::string>& keys,
                                               const ArchiveLimits& limits = {});

}  // namespace fsdp
