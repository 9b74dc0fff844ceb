// The torch.save archive target (targets.h), pure C++: TorchArchive parses the zip, the pickle
// and every tensor record, then every storage record is expanded (CRC checked).
#include <cstring>

#include "core/torch_archive.h"
#include "support/hostile_archives.h"
#include "targets.h"

namespace fsdp::fuzz {

void run_torch_archive(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(reinterpret_cast<const char*>(data),
                                reinterpret_cast<const char*>(data) + size);
  try {
    const TorchArchive archive(bytes);
    for (const PickleNode& n : archive.tree().nodes)
      if (n.kind == PickleNode::Kind::kStorage) archive.zip().read(archive.storage_entry(n));
  } catch (const FormatError&) {
  }
}

std::vector<std::string> torch_archive_seeds() {
  using namespace fsdp::testing;
  std::string f(24, '\0');
  for (int i = 0; i < 6; ++i) {
    const float x = static_cast<float>(i);
    std::memcpy(&f[static_cast<size_t>(i) * 4], &x, 4);
  }
  TensorSpec a{"input_ids", "0", "LongStorage", 3, 0, {1, 3}, {3, 1}};
  TensorSpec b{"hidden_state", "1", "FloatStorage", 6, 0, {1, 2, 3}, {6, 3, 1}};
  TensorSpec c{"loss_mask", "2", "BoolStorage", 3, 0, {3}, {1}};
  return {make_torch_archive(pk_tensor_dict({a, b, c}),
                             {{"0", std::string(24, '\1')}, {"1", f}, {"2", std::string(3, '\1')}}),
          make_torch_archive(pk_tensor_dict({b}), {{"1", f}}, /*deflate_pickle=*/true)};
}

}  // namespace fsdp::fuzz
