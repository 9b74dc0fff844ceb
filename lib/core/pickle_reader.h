// A restricted, bounded unpickler for what torch.save writes: dicts, lists, tuples, strings,
// numbers, booleans, None and tensor records. Globals are an allow-list (tensor rebuilding,
// storage types, OrderedDict, LibTorch's type tags); anything else is refused, nothing is ever
// called. Every opcode's operands are checked against the bytes left, and nesting depth, object
// count, memo size and string length are bounded (PickleLimits), so no input can exhaust the
// stack or memory. Pure C++ (no LibTorch): the fuzz targets build it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/zip_reader.h"  // FormatError

namespace fsdp {

struct PickleLimits {
  uint64_t max_bytes = 64u << 20;   // the pickle itself (dicts of tensors are a few KB)
  uint32_t max_depth = 64;          // containers inside containers
  uint64_t max_objects = 1u << 20;  // values created (including memo copies)
  uint64_t max_memo = 1u << 20;     // memo entries
  uint64_t max_string = 16u << 20;  // bytes of one string
  uint32_t max_dims = 64;           // dimensions of one tensor
};

// One value of the unpickled tree. Values live in PickleTree::nodes and refer to each other by
// index, so a hostile pickle can neither build a cycle that recurses nor a chain whose
// destruction overflows the stack.
struct PickleNode {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kTensor,
    kStorage,
    kGlobal
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;      // kBool, kInt; kTensor: storage offset; kStorage: element count
  double f = 0;       // kFloat
  std::string s;      // kString; kGlobal: "module.name"; kStorage: record key
  std::string dtype;  // kStorage, kTensor: the storage type's dtype name ("float", "bfloat16", ...)
  uint32_t depth = 0;
  // kList/kTuple: items; kDict: key, value, key, value, ...; kTensor: {storage node}.
  std::vector<uint32_t> items;
  std::vector<int64_t> sizes, strides;  // kTensor
};

struct PickleTree {
  std::vector<PickleNode> nodes;
  uint32_t root = 0;
  const PickleNode& at(uint32_t i) const { return nodes[i]; }
};

// Unpickles `data` (protocol 2 to 5 opcodes that torch.save and LibTorch's pickler write).
// Throws FormatError naming the offset and the opcode or the limit that was hit.
PickleTree read_pickle(const char* data, uint64_t size, const PickleLimits& limits = {});

// Bytes per element of a storage dtype name from read_pickle, 0 if unknown.
int dtype_element_size(const std::string& dtype);

}  // namespace fsdp
