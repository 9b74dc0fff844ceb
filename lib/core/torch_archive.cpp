// Checked torch.save archives (core/torch_archive.h).
#include "core/torch_archive.h"
#include "core/error.h"  // fsdp::str (header-only)

#include <limits>

namespace fsdp {

std::string tensor_view_problem(int64_t offset, const std::vector<int64_t>& sizes,
                                const std::vector<int64_t>& strides, int64_t storage_numel) {
  if (sizes.size() != strides.size()) return "sizes and strides differ in length";
  if (offset < 0) return str("negative storage offset ", offset);
  int64_t numel = 1, last = offset;
  bool empty = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0) return str("negative size ", sizes[d], " in dimension ", d);
    if (strides[d] < 0) return str("negative stride ", strides[d], " in dimension ", d);
    if (sizes[d] == 0) empty = true;
    if (__builtin_mul_overflow(numel, sizes[d], &numel)) return "element count overflows 64 bits";
  }
  if (empty) return "";
  for (size_t d = 0; d < sizes.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &reach) ||
        __builtin_add_overflow(last, reach, &last))
      return "the view's extent overflows 64 bits";
  }
  if (last >= storage_numel)
    return str("the view (offset ", offset, ", extent to element ", last,
               ") reaches past its storage of ", storage_numel, " elements");
  return "";
}

TorchArchive::TorchArchive(const std::vector<char>& bytes, const ArchiveLimits& limits)
    : zip_(bytes, limits.zip) {
  check(limits);
}

TorchArchive::TorchArchive(const ZipSource& source, const ArchiveLimits& limits)
    : zip_(source, limits.zip) {
  check(limits);
}

void TorchArchive::check(const ArchiveLimits& limits) {
  const ZipEntry* pkl = nullptr;
  for (const ZipEntry& e : zip_.entries()) {
    const std::string& n = e.name;
    const size_t slash = n.find('/');
    if (slash == std::string::npos || n.compare(slash + 1, std::string::npos, "data.pkl") != 0)
      continue;
    if (pkl) throw FormatError("two data.pkl records");
    pkl = &e;
    prefix_ = n.substr(0, slash + 1);
  }
  if (!pkl) throw FormatError("no data.pkl record (not a torch.save archive)");
  if (const ZipEntry* order = zip_.find(prefix_ + "byteorder")) {
    if (order->uncompressed > 16) throw FormatError("byteorder record of odd size");
    const std::vector<char> v = zip_.read(*order);
    if (std::string(v.begin(), v.end()) != "little")
      throw FormatError("byte order '" + std::string(v.begin(), v.end()) +
                        "' (only little-endian archives are read)");
  }
  if (pkl->uncompressed > limits.pickle.max_bytes)
    throw FormatError(str("data.pkl of ", pkl->uncompressed, " bytes exceeds the limit of ",
                          limits.pickle.max_bytes));
  const std::vector<char> pickle = zip_.read(*pkl);
  tree_ = read_pickle(pickle.data(), pickle.size(), limits.pickle);
  for (const PickleNode& n : tree_.nodes) {
    if (n.kind == PickleNode::Kind::kStorage) {
      const ZipEntry& e = storage_entry(n);
      const int64_t elem = dtype_element_size(n.dtype);
      int64_t want = 0;
      if (__builtin_mul_overflow(n.i, elem, &want) || static_cast<uint64_t>(want) != e.uncompressed)
        throw FormatError(str("storage '", n.s, "' declares ", n.i, " ", n.dtype,
                              " elements but its record '", e.name, "' holds ", e.uncompressed,
                              " bytes"));
    } else if (n.kind == PickleNode::Kind::kTensor) {
      const PickleNode& s = tree_.at(n.items[0]);
      const std::string problem = tensor_view_problem(n.i, n.sizes, n.strides, s.i);
      if (!problem.empty()) throw FormatError(str("tensor on storage '", s.s, "': ", problem));
    }
  }
}

const ZipEntry& TorchArchive::storage_entry(const PickleNode& storage) const {
  const ZipEntry* e = zip_.find(prefix_ + "data/" + storage.s);
  if (!e)
    throw FormatError(str("storage '", storage.s, "' has no record ", prefix_, "data/", storage.s));
  return *e;
}

}  // namespace fsdp
