// dtype name tables (core/dtype.h).
#include "core/dtype.h"

#include "core/error.h"

namespace fsdp {

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "float" || name == "no") return c10::kFloat;
  if (name == "bf16" || name == "bfloat16") return c10::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return c10::kHalf;
  if (name == "fp64" || name == "float64" || name == "double") return c10::kDouble;
  FSDP_USAGE_FAIL("unknown dtype '" + name + "'", "use fp32 or bf16");
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "fp32";
    case c10::kBFloat16:
      return "bf16";
    case c10::kHalf:
      return "fp16";
    case c10::kDouble:
      return "fp64";
    case c10::kLong:
      return "int64";
    case c10::kInt:
      return "int32";
    case c10::kShort:
      return "int16";
    case c10::kChar:
      return "int8";
    case c10::kByte:
      return "uint8";
    case c10::kBool:
      return "bool";
    case c10::kFloat8_e4m3fn:
      return "fp8_e4m3";
    default:
      return c10::toString(t);
  }
}

c10::ScalarType dtype_from_safetensors(const std::string& s) {
  if (s == "F32") return c10::kFloat;
  if (s == "BF16") return c10::kBFloat16;
  if (s == "F16") return c10::kHalf;
  if (s == "F64") return c10::kDouble;
  if (s == "I64") return c10::kLong;
  if (s == "I32") return c10::kInt;
  if (s == "I16") return c10::kShort;
  if (s == "I8") return c10::kChar;
  if (s == "U8") return c10::kByte;
  if (s == "BOOL") return c10::kBool;
  if (s == "F8_E4M3") return c10::kFloat8_e4m3fn;
  FSDP_USAGE_FAIL("unsupported safetensors dtype '" + s + "'",
                  "supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3");
}

std::string dtype_to_safetensors(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "F32";
    case c10::kBFloat16:
      return "BF16";
    case c10::kHalf:
      return "F16";
    case c10::kDouble:
      return "F64";
    case c10::kLong:
      return "I64";
    case c10::kInt:
      return "I32";
    case c10::kShort:
      return "I16";
    case c10::kChar:
      return "I8";
    case c10::kByte:
      return "U8";
    case c10::kBool:
      return "BOOL";
    case c10::kFloat8_e4m3fn:
      return "F8_E4M3";
    default:
      break;
  }
  FSDP_FAIL("dtype " + dtype_name(t) + " has no safetensors name",
            "this is a bug in fsdp-train: please report it with the command line and log");
}

size_t dtype_size(c10::ScalarType t) {
  return c10::elementSize(t);
}

std::optional<c10::ScalarType> dtype_from_storage_name(const std::string& name) {
  static const std::pair<const char*, c10::ScalarType> kTable[] = {
      {"float", c10::kFloat},       {"double", c10::kDouble}, {"half", c10::kHalf},
      {"bfloat16", c10::kBFloat16}, {"int64", c10::kLong},    {"int32", c10::kInt},
      {"int16", c10::kShort},       {"int8", c10::kChar},     {"uint8", c10::kByte},
      {"bool", c10::kBool}};
  for (const auto& [n, t] : kTable)
    if (name == n) return t;
  return std::nullopt;
}

}  // namespace fsdp
