// fp8 (E4M3) storage of hidden states with one scale per row and captured layer: the native
// shards' compact form (`convert --dtype fp8_e4m3`, docs/data.md). Quantising a row group x with
// amax = max|x| gives scale = amax / 448 (1 when amax is 0) and q = fp8(x / scale); reading gives
// bf16(q * scale). E4M3 keeps 3 mantissa bits, so each element is within 2^-4 of |x| relative,
// plus scale * 2^-10 near zero (subnormals), before the final bf16 rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace fsdp::data {

inline constexpr double kFp8E4M3Max = 448.0;

struct Fp8Rows {
  at::Tensor q;      // float8_e4m3fn [S, W]
  at::Tensor scale;  // fp32 [S, G]: one scale per row and group of W / G columns
};

// x: [S, W] (any floating dtype, finite); groups must divide W. Row group g of row s covers
// columns [g*W/G, (g+1)*W/G): one captured layer of an aux_hidden_state row.
Fp8Rows quantize_fp8_rows(const at::Tensor& x, int64_t groups);

// bf16 [S, W]. Throws BadSampleError naming `where` and `key` when the scale tensor is missing
// (undefined), has the wrong shape or dtype, or holds a value that is not finite and positive.
at::Tensor dequantize_fp8_rows(const at::Tensor& q, const at::Tensor& scale,
                               const std::string& where, const std::string& key);

// The same with tensor operations (fp32 conversion, multiply, bf16 cast), unchecked: the
// reference the one-pass loop of dequantize_fp8_rows is tested against, bit for bit.
at::Tensor dequantize_fp8_rows_reference(const at::Tensor& q, const at::Tensor& scale);

}  // namespace fsdp::data
