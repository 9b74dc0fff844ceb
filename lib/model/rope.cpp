// RoPE tables for the draft model: frequencies per scaling type (HF transformers' formulas),
// fp32 cos/sin tables that grow on demand, and the rotate-half application.
#include "model/rope.h"

#include <ATen/ATen.h>

#include <cmath>

#include "core/error.h"

namespace fsdp::model {
namespace {

// yarn helpers: the dimension at which a frequency makes `rotations` turns over the context.
double correction_dim(double rotations, int64_t dim, double base, int64_t max_pos) {
  return (dim * std::log(max_pos / (rotations * 2 * M_PI))) / (2 * std::log(base));
}

double yarn_mscale(double scale, double mscale = 1.0) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeFrequencies rope_frequencies(const DraftConfig& cfg) {
  const int64_t dim = cfg.head_dim_value();
  const double base = cfg.rope_theta;
  const RopeScaling& rs = cfg.rope_scaling;
  // base ** (2k/d) in fp32, as HF computes it.
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor pos_freqs = at::pow(base, exponents);
  at::Tensor inv_freq = 1.0 / pos_freqs;
  RopeFrequencies out;
  switch (rs.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      inv_freq = inv_freq / rs.factor;
      break;
    case RopeType::kLlama3: {
      const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
      const double low_wavelen = old_ctx / rs.low_freq_factor;
      const double high_wavelen = old_ctx / rs.high_freq_factor;
      at::Tensor wavelen = 2 * M_PI / inv_freq;
      at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
      at::Tensor smooth =
          (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      at::Tensor smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
      at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
      inv_freq = at::where(medium, smoothed, scaled);
      break;
    }
    case RopeType::kYarn: {
      const int64_t orig = rs.original_max_position_embeddings > 0
                               ? rs.original_max_position_embeddings
                               : cfg.max_position_embeddings;
      if (rs.attention_factor) {
        out.attention_scaling = *rs.attention_factor;
      } else if (rs.mscale && rs.mscale_all_dim) {
        out.attention_scaling =
            yarn_mscale(rs.factor, *rs.mscale) / yarn_mscale(rs.factor, *rs.mscale_all_dim);
      } else {
        out.attention_scaling = yarn_mscale(rs.factor);
      }
      double low = correction_dim(rs.beta_fast, dim, base, orig);
      double high = correction_dim(rs.beta_slow, dim, base, orig);
      if (rs.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // avoid a zero-width ramp
      at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
      at::Tensor extrapolation_factor = 1 - ramp;
      at::Tensor interp = 1.0 / (rs.factor * pos_freqs);
      at::Tensor extrap = 1.0 / pos_freqs;
      inv_freq = interp * (1 - extrapolation_factor) + extrap * extrapolation_factor;
      break;
    }
  }
  out.inv_freq = inv_freq.contiguous();
  return out;
}

RotaryEmbedding::RotaryEmbedding(const DraftConfig& cfg, int64_t initial_positions)
    : freqs_(rope_frequencies(cfg)) {
  grow(std::max<int64_t>(initial_positions, 1));
}

void RotaryEmbedding::grow(int64_t positions) {
  at::Tensor t = at::arange(positions, at::kFloat);
  at::Tensor freqs = at::outer(t, freqs_.inv_freq);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  cos_ = (emb.cos() * freqs_.attention_scaling).contiguous();
  sin_ = (emb.sin() * freqs_.attention_scaling).contiguous();
  // Double-precision tables (same fp32 inv_freq) for float64 runs: gradient checks need the
  // rotation exact to 1e-16, not to fp32 rounding.
  at::Tensor emb64 = at::outer(at::arange(positions, at::kDouble), freqs_.inv_freq.to(at::kDouble));
  emb64 = at::cat({emb64, emb64}, -1);
  cos64_ = (emb64.cos() * freqs_.attention_scaling).contiguous();
  sin64_ = (emb64.sin() * freqs_.attention_scaling).contiguous();
  cos_cached_ = at::Tensor();
  sin_cached_ = at::Tensor();
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::slice(int64_t offset, int64_t len,
                                                         c10::ScalarType dtype,
                                                         c10::Device device) {
  FSDP_CHECK(freqs_.inv_freq.defined(), "RotaryEmbedding used before construction",
             "build it from the draft config");
  FSDP_CHECK(offset >= 0 && len >= 0, fsdp::str("rope slice [", offset, ", +", len, ") is invalid"),
             "positions are non-negative");
  if (offset + len > positions()) {
    // Grow geometrically so a few long sequences do not rebuild the table every step.
    grow(std::max(offset + len, positions() * 2));
  }
  if (!cos_cached_.defined() || cos_cached_.scalar_type() != dtype ||
      cos_cached_.device() != device) {
    const bool wide = dtype == at::kDouble;
    cos_cached_ = (wide ? cos64_ : cos_).to(device, dtype);
    sin_cached_ = (wide ? sin64_ : sin_).to(device, dtype);
  }
  return {cos_cached_.narrow(0, offset, len), sin_cached_.narrow(0, offset, len)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  at::Tensor rotated = at::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

}  // namespace fsdp::model
