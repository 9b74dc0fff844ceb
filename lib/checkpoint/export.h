// The consolidated draft export of docs/reference.md §7: config.json (the draft config) and
// model.safetensors (every tensor of docs/reference.md §3 except embed_tokens, bf16, plus d2t int64
// and t2d bool), loadable by a serving engine and the safetensors library. Also the reader used
// by --init-checkpoint and --eval-only. Rank 0 only; never writes training state.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>

namespace fsdp::checkpoint {

// Writes `dir`/config.json (config_json verbatim) and `dir`/model.safetensors from full tensors
// by name (any float dtype: stored as `dtype`, bf16 by default as docs/reference.md §7 says;
// "embed_tokens.weight" is left out), with d2t and t2d. Tensor order: sorted by name. Returns
// the bytes of model.safetensors.
uint64_t write_draft_export(const std::string& dir, const std::string& config_json,
                            const std::map<std::string, at::Tensor>& full_state,
                            const at::Tensor& d2t, const at::Tensor& t2d,
                            c10::ScalarType dtype = c10::kBFloat16);

struct DraftExport {
  std::map<std::string, at::Tensor> weights;  // trainable tensors as stored (bf16)
  at::Tensor d2t;                             // int64 [Vd], undefined when absent
  at::Tensor t2d;                             // bool [V], undefined when absent
  std::string config_path;
};
// Reads an export directory (model.safetensors + config.json). Throws UsageError naming the
// directory when a file is missing or corrupt.
DraftExport read_draft_export(const std::string& dir);
// Only d2t and t2d of an export (what its lm_head rows mean), without reading the weights.
// Undefined tensors when the file has none; throws UsageError like read_draft_export.
std::pair<at::Tensor, at::Tensor> read_export_mapping(const std::string& dir);

}  // namespace fsdp::checkpoint
