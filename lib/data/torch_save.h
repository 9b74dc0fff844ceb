// Writes dicts of tensors in the torch.save zip format that Python's default
// torch.load(weights_only=True) accepts. torch::pickle_save tags typed dicts with
// torch.jit._pickle.restore_type_tag, a global the weights-only unpickler rejects (torch >= 2.6),
// so SpecForge and Python would refuse our files; this writer pickles plain dicts instead.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace fsdp::data {

// The bytes of torch.save(dict) for a string -> tensor dict (tensors are saved contiguous, CPU).
std::vector<char> torch_save_bytes(const c10::Dict<std::string, at::Tensor>& dict);

// Same, written atomically to `path` (temp file + rename). Throws fsdp::Error naming the path.
void torch_save_file(const std::string& path, const c10::Dict<std::string, at::Tensor>& dict);

}  // namespace fsdp::data
