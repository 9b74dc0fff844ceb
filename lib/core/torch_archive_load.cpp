// TorchArchive -> IValue (core/torch_archive_load.h).
#include "core/torch_archive_load.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "core/dtype.h"

namespace fsdp {

namespace {

at::ScalarType scalar_type_of(const std::string& d) {
  const std::optional<at::ScalarType> t = dtype_from_storage_name(d);
  if (!t) throw FormatError("unknown dtype " + d);
  return *t;
}

class Converter {
 public:
  Converter(const TorchArchive& a, const ArchiveLimits& limits) : a_(a), limits_(limits) {}

  c10::IValue convert(uint32_t index, uint32_t depth) {
    // The tree may share values (memo) or even hold cycles: the depth and visit budgets bound
    // the walk whatever its shape.
    if (depth > limits_.pickle.max_depth)
      throw FormatError("nesting deeper than " + std::to_string(limits_.pickle.max_depth) +
                        " (or a cycle)");
    if (++visits_ > limits_.pickle.max_objects)
      throw FormatError("more than " + std::to_string(limits_.pickle.max_objects) +
                        " values to build (shared references)");
    using Kind = PickleNode::Kind;
    const PickleNode& n = a_.tree().at(index);
    switch (n.kind) {
      case Kind::kNone:
        return c10::IValue();
      case Kind::kBool:
        return c10::IValue(n.i != 0);
      case Kind::kInt:
        return c10::IValue(n.i);
      case Kind::kFloat:
        return c10::IValue(n.f);
      case Kind::kString:
        return c10::IValue(n.s);
      case Kind::kList:
      case Kind::kTuple: {
        c10::impl::GenericList list(c10::AnyType::get());
        for (uint32_t i : n.items) list.push_back(convert(i, depth + 1));
        return c10::IValue(list);
      }
      case Kind::kDict: {
        c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
        for (size_t i = 0; i + 1 < n.items.size(); i += 2) {
          c10::IValue k = convert(n.items[i], depth + 1);
          if (!k.isString() && !k.isInt() && !k.isBool())
            throw FormatError("dict key that is not a string, integer or bool");
          dict.insert_or_assign(std::move(k), convert(n.items[i + 1], depth + 1));
        }
        return c10::IValue(dict);
      }
      case Kind::kTensor: {
        const PickleNode& s = a_.tree().at(n.items[0]);
        at::Tensor t = at::empty({0}, at::TensorOptions().dtype(scalar_type_of(s.dtype)));
        t.set_(storage(s), n.i, n.sizes, n.strides);
        return c10::IValue(t);
      }
      case Kind::kStorage:
      case Kind::kGlobal:
        break;
    }
    throw FormatError("a storage or global where a value belongs");
  }

 private:
  c10::Storage storage(const PickleNode& s) {
    if (const auto it = storages_.find(s.s); it != storages_.end()) return it->second;
    const ZipEntry& e = a_.storage_entry(s);
    c10::Storage st(c10::Storage::use_byte_size_t(), static_cast<size_t>(e.uncompressed),
                    c10::GetDefaultCPUAllocator(), /*resizable=*/false);
    char* data = static_cast<char*>(st.mutable_data());
    a_.zip().read_into(e, data);
    if (s.dtype == "bool") {
      for (uint64_t i = 0; i < e.uncompressed; ++i)
        if (static_cast<unsigned char>(data[i]) > 1)
          throw FormatError("bool storage '" + s.s + "' holds a byte other than 0 and 1");
    }
    storages_.emplace(s.s, st);
    return st;
  }

  const TorchArchive& a_;
  const ArchiveLimits& limits_;
  uint64_t visits_ = 0;
  std::map<std::string, c10::Storage> storages_;
};

}  // namespace

c10::IValue load_torch_archive(const std::vector<char>& bytes, const ArchiveLimits& limits) {
  const TorchArchive archive(bytes, limits);
  return Converter(archive, limits).convert(archive.tree().root, 0);
}

c10::impl::GenericDict load_torch_archive_keys(const TorchArchive& archive,
                                               const std::vector<std::string>& keys,
                                               const ArchiveLimits& limits) {
  const PickleNode& root = archive.tree().at(archive.tree().root);
  if (root.kind != PickleNode::Kind::kDict)
    throw FormatError("the archive's object is not a dict (expected a dict of tensors)");
  Converter converter(archive, limits);
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  for (size_t i = 0; i + 1 < root.items.size(); i += 2) {
    const PickleNode& key = archive.tree().at(root.items[i]);
    if (key.kind != PickleNode::Kind::kString ||
        std::find(keys.begin(), keys.end(), key.s) == keys.end())
      continue;
    dict.insert_or_assign(key.s, converter.convert(root.items[i + 1], 1));
  }
  return dict;
}

}  // namespace fsdp
