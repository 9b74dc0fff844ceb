// torch.save-compatible writing of tensor dicts without type tags (torch_save.h). Mirrors what
// torch::pickle_save does (pickle + zip archive with one record per storage) but with
// tag_aggregates = false.
#include "data/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace fsdp::data {

std::vector<char> torch_save_bytes(const c10::Dict<std::string, at::Tensor>& dict) {
  c10::Dict<std::string, at::Tensor> plain;
  for (const auto& kv : dict) plain.insert(kv.key(), kv.value().to(at::kCPU).contiguous());
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(plain));
  pickler.stop();
  std::vector<char> out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    out.insert(out.end(), c, c + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return out;
}

void torch_save_file(const std::string& path, const c10::Dict<std::string, at::Tensor>& dict) {
  const std::vector<char> bytes = torch_save_bytes(dict);
  const std::string tmp = str(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FSDP_CHECK(out.good(), tmp + ": cannot create",
               "check that the directory exists and is writable");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    FSDP_CHECK(out.good(), tmp + ": write failed", "check free disk space");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace fsdp::data
