// Names and sizes of tensor element types, shared by the safetensors code, configs and logs.
// The one place that maps between torch ScalarType, safetensors dtype strings and user names.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace fsdp {

// "fp32", "bf16", ... as users write them in flags (--mixed-precision, --reduce-dtype).
c10::ScalarType parse_dtype(const std::string& name);
std::string dtype_name(c10::ScalarType t);
// safetensors header strings: "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL".
c10::ScalarType dtype_from_safetensors(const std::string& s);
std::string dtype_to_safetensors(c10::ScalarType t);
size_t dtype_size(c10::ScalarType t);
// The element type of a torch.save storage by the name core/pickle_reader.h gives it ("float",
// "bfloat16", "int64", ...: PickleNode::dtype); nullopt for a name the reader never gives.
std::optional<c10::ScalarType> dtype_from_storage_name(const std::string& name);

}  // namespace fsdp
