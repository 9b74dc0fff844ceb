// fp8 row quantisation of hidden states (fp8.h).
#include "data/fp8.h"

#include <ATen/ATen.h>
#include <c10/util/Float8_e4m3fn.h>

#include <array>

#include "core/error.h"
#include "data/dataset.h"

namespace fsdp::data {

Fp8Rows quantize_fp8_rows(const at::Tensor& x, int64_t groups) {
  FSDP_CHECK(x.dim() == 2 && groups > 0 && x.size(1) % groups == 0,
             fsdp::str("quantize_fp8_rows: shape ", x.sizes(), " with ", groups, " groups"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  const int64_t s = x.size(0), w = x.size(1);
  const at::Tensor x3 = x.to(at::kFloat).reshape({s, groups, w / groups});
  const at::Tensor amax = x3.abs().amax(-1);  // [S, G]
  const at::Tensor scale = at::where(amax > 0, amax / kFp8E4M3Max, at::ones_like(amax));
  // Clamp: fp32 rounding of x / scale can land a hair above 448, which E4M3 (no infinity) would
  // turn into NaN.
  const at::Tensor q = (x3 / scale.unsqueeze(-1))
                           .clamp(-kFp8E4M3Max, kFp8E4M3Max)
                           .to(at::kFloat8_e4m3fn)
                           .reshape({s, w});
  return {q.contiguous(), scale.contiguous()};
}

namespace {

// The 256 E4M3 values as floats (the two NaN encodings stay NaN, caught by the finite check).
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i)
      t[i] = static_cast<float>(
          c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
    return t;
  }();
  return table;
}

// One pass over the bytes: table lookup, fp32 multiply, round to nearest even bf16 — the same
// operations as the reference (fp32 conversion, fp32 multiply, bf16 cast), so bitwise equal
// (tested), at memory speed in the loader threads instead of three tensor passes.
at::Tensor dequantize_fp8_rows_unchecked(const at::Tensor& q, const at::Tensor& scale, int64_t s,
                                         int64_t w, int64_t g) {
  const at::Tensor qc = q.contiguous();
  const auto* qp = static_cast<const uint8_t*>(qc.data_ptr());
  const float* sp = scale.data_ptr<float>();
  at::Tensor out = at::empty({s, w}, at::kBFloat16);
  auto* op = out.data_ptr<c10::BFloat16>();
  const std::array<float, 256>& table = fp8_table();
  const int64_t per = w / g;
  for (int64_t r = 0; r < s; ++r) {
    for (int64_t k = 0; k < g; ++k) {
      const float sc = sp[r * g + k];
      const int64_t base = r * w + k * per;
      for (int64_t j = 0; j < per; ++j) op[base + j] = c10::BFloat16(table[qp[base + j]] * sc);
    }
  }
  return out;
}

}  // namespace

at::Tensor dequantize_fp8_rows(const at::Tensor& q, const at::Tensor& scale,
                               const std::string& where, const std::string& key) {
  auto bad = [&](const std::string& problem) {
    throw BadSampleError(where + ": " + key + ": " + problem,
                         "convert the sample again (`fsdp-train convert --dtype fp8_e4m3`), or run "
                         "with --skip-bad-samples",
                         __FILE__, __LINE__);
  };
  if (!scale.defined()) bad("fp8 values without their scales (" + key + "_scale is missing)");
  if (q.dim() != 2) bad(fsdp::str("fp8 tensor has shape ", q.sizes(), ", expected [S, W]"));
  if (scale.scalar_type() != at::kFloat || scale.dim() != 2 || scale.size(0) != q.size(0) ||
      scale.size(1) == 0 || q.size(1) % scale.size(1) != 0)
    bad(fsdp::str("scale has shape ", scale.sizes(), " and dtype ", scale.scalar_type(),
                  ", expected fp32 [", q.size(0), ", G] with G dividing ", q.size(1)));
  if (!(scale.isfinite() & (scale > 0)).all().item<bool>())
    bad("scale holds a value that is not finite and positive");
  const int64_t s = q.size(0), w = q.size(1), g = scale.size(1);
  return dequantize_fp8_rows_unchecked(q, scale.contiguous(), s, w, g);
}

at::Tensor dequantize_fp8_rows_reference(const at::Tensor& q, const at::Tensor& scale) {
  const int64_t s = q.size(0), w = q.size(1), g = scale.size(1);
  return (q.to(at::kFloat).reshape({s, g, w / g}) * scale.unsqueeze(-1))
      .reshape({s, w})
      .to(at::kBFloat16)
      .contiguous();
}

}  // namespace fsdp::data
