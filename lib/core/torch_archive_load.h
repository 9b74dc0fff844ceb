// LibTorch values from a checked torch.save archive (core/torch_archive.h): what replaces
// torch::pickle_load for feature files, vocabulary mappings and training-state shards.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

#include "core/torch_archive.h"

namespace fsdp {

// The archive's object as an IValue: dicts (string, int or bool keys), lists and tuples
// (as lists), strings, ints, floats, bools, None and CPU tensors. Every storage record is read
// (and CRC checked) once, straight into the tensor's memory; tensors sharing a storage share it.
// Throws FormatError (callers add the file's name and a hint).
c10::IValue load_torch_archive(const std::vector<char>& bytes, const ArchiveLimits& limits = {});

}  // namespace fsdp
