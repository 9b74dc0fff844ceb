// Aux hidden-state noise: a pure function of (seed, epoch, sample index), different for other
// samples, epochs and seeds, the documented distribution (empirical mean, standard deviation and
// range on a large tensor), bitwise identity at std 0, the input never written, and through the
// loader: the training batch carries exactly that noise on the aux rows only, the same on 1 and 2
// ranks, while default loader options (the evaluation loader's) add none.
#include "data/noise.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "data/loader.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

NoiseOptions noise(double std, NoiseType type = NoiseType::kUniform, uint64_t seed = 3) {
  NoiseOptions o;
  o.std = std;
  o.type = type;
  o.seed = seed;
  return o;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

// Sample i: S = 4 + i % 3 tokens, H = 4, aux [S, 12] with values that identify the sample.
class AuxDataset : public FeatureDataset {
 public:
  explicit AuxDataset(int64_t n) : n_(n) {}
  std::string format() const override { return "test"; }
  int64_t size() const override { return n_; }
  RawSample read(int64_t i) const override {
    const int64_t s = 4 + i % 3;
    return validate_sample(at::arange(s, at::kLong) + 10 * i, at::ones({s}, at::kLong),
                           at::full({s, 4}, static_cast<double>(i), at::kBFloat16),
                           (at::arange(s * 12, at::kFloat).view({s, 12}) / 8 + i).to(at::kBFloat16),
                           source(i), {});
  }
  TokenSample read_tokens(int64_t i) const override {
    const auto r = read(i);
    return {r.input_ids, r.loss_mask};
  }
  std::string source(int64_t i) const override { return "aux:" + std::to_string(i); }
  const std::string& root() const override { return root_; }

 private:
  int64_t n_;
  std::string root_ = "aux";
};

// Every sample's aux rows as one loader (rank of world) hands them out over an epoch.
std::map<int64_t, at::Tensor> aux_rows(const std::shared_ptr<AuxDataset>& ds, int rank, int world,
                                       const LoaderOptions& o, int64_t epoch) {
  DataLoader l(ds, DistributedSampler(ds->size(), rank, world, 1, 5), o);
  l.start({epoch, 0});
  std::map<int64_t, at::Tensor> out;
  while (auto b = l.next()) {
    const int64_t idx = b->sample_indices[0];
    const int64_t s = ds->read(idx).length();
    // The target hidden state is never noised.
    CHECK(same(b->target_hidden[0].narrow(0, 0, s - 1),
               ds->read(idx).hidden_state.narrow(0, 1, s - 1)));
    out[idx] = b->aux_hidden[0].narrow(0, 0, s).clone();
  }
  return out;
}

}  // namespace

TEST_CASE("noise is a pure function of seed, epoch and sample index", "[data]") {
  const at::Tensor x = at::randn({16, 24}).to(at::kBFloat16);
  for (NoiseType type : {NoiseType::kUniform, NoiseType::kGaussian}) {
    const NoiseOptions o = noise(0.05, type);
    const at::Tensor a = add_aux_noise(x, o, 2, 17);
    CHECK(same(a, add_aux_noise(x, o, 2, 17)));
    CHECK(a.scalar_type() == at::kBFloat16);
    CHECK_FALSE(at::equal(a, x));
    // Another sample, epoch, seed.
    CHECK_FALSE(at::equal(a, add_aux_noise(x, o, 2, 18)));
    CHECK_FALSE(at::equal(a, add_aux_noise(x, o, 3, 17)));
    CHECK_FALSE(at::equal(a, add_aux_noise(x, noise(0.05, type, 4), 2, 17)));
  }
  // Distinct streams per (epoch, index), also where a naive seed + epoch + index would collide.
  const NoiseStream s1 = noise_stream(3, 1, 2), s2 = noise_stream(3, 2, 1);
  CHECK((s1.key != s2.key || s1.subsequence != s2.subsequence));
  CHECK(noise_stream(3, 1, 2).key == s1.key);
}

TEST_CASE("noise has the documented distribution", "[data]") {
  const at::Tensor zeros = at::zeros({1000, 1000}, at::kFloat);
  const double s = 0.05;
  SECTION("uniform: U(-s, s), standard deviation s / sqrt(3)") {
    const at::Tensor n = add_aux_noise(zeros, noise(s), 0, 0);
    // Bounds about 5 standard errors wide for 10^6 draws.
    CHECK(std::abs(n.mean().item<double>()) < 3e-3 * s);
    CHECK(n.std().item<double>() == Approx(s / std::sqrt(3.0)).epsilon(5e-3));
    CHECK(n.min().item<double>() >= -s);
    CHECK(n.max().item<double>() < s);
    CHECK(n.max().item<double>() > 0.999 * s);
  }
  SECTION("gaussian: N(0, s^2)") {
    const at::Tensor n = add_aux_noise(zeros, noise(s, NoiseType::kGaussian), 0, 0);
    CHECK(std::abs(n.mean().item<double>()) < 5e-3 * s);
    CHECK(n.std().item<double>() == Approx(s).epsilon(5e-3));
    // A normal's share within one standard deviation: 68.27%.
    CHECK((n.abs() < s).to(at::kDouble).mean().item<double>() == Approx(0.6827).margin(2e-3));
    CHECK(at::isfinite(n).all().item<bool>());
  }
  SECTION("an odd element count draws the last element too") {
    const at::Tensor n = add_aux_noise(at::zeros({3, 5}), noise(s, NoiseType::kGaussian), 0, 0);
    CHECK((n != 0).all().item<bool>());
  }
}

TEST_CASE("noise: std 0 is bitwise identity, the input is never written", "[data]") {
  const at::Tensor x = at::randn({8, 12}).to(at::kBFloat16);
  const at::Tensor before = x.clone();
  const at::Tensor off = add_aux_noise(x, noise(0), 1, 1);
  CHECK(same(off, before));
  CHECK(off.data_ptr() == x.data_ptr());
  const at::Tensor view = x.narrow(0, 0, 4);  // as process_sample's truncation returns
  add_aux_noise(view, noise(0.1), 1, 1);
  add_aux_noise(view, noise(0.1, NoiseType::kGaussian), 1, 1);
  CHECK(same(x, before));
}

TEST_CASE("noise: added in fp32, rounded once; a token's noise ignores truncation", "[data]") {
  const at::Tensor x = at::randn({10, 6}).to(at::kBFloat16);
  const NoiseOptions o = noise(0.05);
  const at::Tensor fp32 = add_aux_noise(x.to(at::kFloat), o, 0, 9);
  CHECK(same(add_aux_noise(x, o, 0, 9), fp32.to(at::kBFloat16)));
  CHECK(same(add_aux_noise(x.narrow(0, 0, 4), o, 0, 9), add_aux_noise(x, o, 0, 9).narrow(0, 0, 4)));
}

TEST_CASE("noise: a negative or non-finite --noise-std is refused naming the flag", "[data]") {
  CHECK_NOTHROW(noise(0).validate());
  CHECK_NOTHROW(noise(0.05).validate());
  for (double bad : {-0.01, std::nan(""), HUGE_VAL, 1e3}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { noise(bad).validate(); }), Catch::Contains("--noise-std"));
  }
  LoaderOptions lo;
  lo.noise = noise(-1);
  CHECK_THAT(error_of([&] { lo.validate(); }), Catch::Contains("--noise-std"));
}

TEST_CASE("loader: noise on training aux rows, the same on 1 and 2 ranks; none by default",
          "[data]") {
  auto ds = std::make_shared<AuxDataset>(12);
  LoaderOptions plain;  // the evaluation loader's options: no noise
  LoaderOptions noisy;
  noisy.noise = noise(0.05);
  noisy.prefetch_threads = 2;
  for (int64_t epoch : {0, 1}) {
    INFO("epoch " << epoch);
    const auto clean = aux_rows(ds, 0, 1, plain, epoch);
    const auto one = aux_rows(ds, 0, 1, noisy, epoch);
    auto two = aux_rows(ds, 0, 2, noisy, epoch);
    for (const auto& [i, t] : aux_rows(ds, 1, 2, noisy, epoch)) two[i] = t;
    REQUIRE(clean.size() == 12);
    REQUIRE(one.size() == 12);
    REQUIRE(two.size() == 12);
    for (int64_t i = 0; i < 12; ++i) {
      INFO("sample " << i);
      const at::Tensor raw = ds->read(i).aux_hidden_state;
      CHECK(same(clean.at(i), raw));
      CHECK(same(one.at(i), add_aux_noise(raw, noisy.noise, epoch, i)));
      CHECK(same(two.at(i), one.at(i)));
    }
  }
}
