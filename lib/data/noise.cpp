// Aux hidden-state noise (noise.h). One Philox stream per sample, consumed in row-major order:
// the same values whatever thread, rank or resume point builds the batch. Not parallelised on
// purpose: it runs in the loader's reader threads, which are serial (loader.cpp).
#include "data/noise.h"

#include <ATen/ATen.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <cmath>

#include "core/error.h"
#include "core/hash.h"

namespace fsdp::data {

namespace {

// The top 24 bits of a 32-bit draw as a float in [0, 1): exact, 2^24 equally likely values.
float unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

}  // namespace

NoiseStream noise_stream(uint64_t seed, int64_t epoch, int64_t sample_index) {
  // A domain constant keeps these keys apart from anything else seeded with --seed.
  constexpr uint64_t kDomain = 0x6e6f6973652d6175ull;  // "noise-au"
  NoiseStream s;
  s.key = mix64(mix64(seed ^ kDomain) ^ static_cast<uint64_t>(epoch));
  s.subsequence = static_cast<uint64_t>(sample_index);
  return s;
}

at::Tensor add_aux_noise(const at::Tensor& aux, const NoiseOptions& options, int64_t epoch,
                         int64_t sample_index) {
  if (!options.enabled()) return aux;
  FSDP_CHECK(aux.defined() && aux.device().is_cpu() && aux.is_floating_point(),
             "add_aux_noise: the aux hidden state must be a floating-point CPU tensor",
             "this is a bug in fsdp-train: please report it with the command line and log");
  // A copy in fp32: the noise is added once at full precision and rounded once at the end.
  at::Tensor out = aux.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  const NoiseStream stream = noise_stream(options.seed, epoch, sample_index);
  at::philox_engine rng(stream.key, stream.subsequence, /*offset=*/0);  // Philox4x32-10
  float* p = out.data_ptr<float>();
  const int64_t n = out.numel();
  const float s = static_cast<float>(options.std);
  switch (options.type) {
    case NoiseType::kUniform:
      for (int64_t i = 0; i < n; ++i) p[i] += s * (2.0f * unit_float(rng()) - 1.0f);
      break;
    case NoiseType::kGaussian: {
      // Box-Muller over draw pairs (2k, 2k+1): two independent normals per pair, element 2k
      // takes the cosine and 2k+1 the sine. The uniforms come from the stream in the scalar
      // loop; log, cos and sin run as vectorised tensor ops, several times faster than libm's.
      const int64_t pairs = (n + 1) / 2;
      at::Tensor z = at::empty({pairs, 2}, at::kFloat);
      float* d = z.data_ptr<float>();
      for (int64_t i = 0; i < 2 * pairs; ++i) d[i] = unit_float(rng());
      // u1 in (0, 1] so that log(u1) is finite.
      const at::Tensor r = (z.select(1, 0) + 1.0f / 16777216.0f).log_().mul_(-2.0f).sqrt_().mul_(s);
      const at::Tensor angle = z.select(1, 1).mul(6.283185307179586f);
      at::Tensor cos_out = z.select(1, 0), sin_out = z.select(1, 1);
      at::mul_out(cos_out, r, angle.cos());
      at::mul_out(sin_out, r, angle.sin_());
      out.view(-1).add_(z.view(-1).narrow(0, 0, n));
      break;
    }
  }
  return aux.scalar_type() == at::kFloat ? out : out.to(aux.scalar_type());
}

}  // namespace fsdp::data
