// SpecForge's compressed dumps (.ckpt.gz), fp8 native shards, the final norm applied to pre-norm
// features, and the dump's own vocab mapping: each read back against the plain path.
#include <ATen/ATen.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "core/gzip_reader.h"
#include "data/dataset.h"
#include "data/final_norm.h"
#include "data/fp8.h"
#include "data/native_format.h"
#include "data/vocab_mapping.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;

namespace {

std::vector<char> gzip_bytes(const std::vector<char>& raw, int level = 6) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<char> out(deflateBound(&z, raw.size()) + 64);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void write_gz(const fs::path& p, const c10::Dict<std::string, at::Tensor>& d) {
  write_bytes(p, gzip_bytes(torch_save_bytes(d)));
}

bool same_sample(const RawSample& a, const RawSample& b) {
  return at::equal(a.input_ids, b.input_ids) && at::equal(a.loss_mask, b.loss_mask) &&
         at::equal(a.hidden_state, b.hidden_state) &&
         at::equal(a.aux_hidden_state, b.aux_hidden_state);
}

}  // namespace

TEST_CASE("gzip: a .ckpt.gz reads bit-equal to its .ckpt, in a mixed tree", "[data][gzip]") {
  const auto dir = temp_dir("gz_mixed");
  for (int i = 0; i < 4; ++i) {
    const auto d = make_sample(5 + i, 4, i);
    write_ckpt(dir / "plain" / fsdp::str("data_", i, ".ckpt"), d);
    // Mixed: even samples compressed, odd ones not (SpecForge's resume treats both as present).
    if (i % 2 == 0)
      write_gz(dir / "mixed" / fsdp::str("data_", i, ".ckpt.gz"), d);
    else
      write_ckpt(dir / "mixed" / fsdp::str("data_", i, ".ckpt"), d);
  }
  auto plain = open_feature_dataset((dir / "plain").string());
  auto mixed = open_feature_dataset((dir / "mixed").string());
  REQUIRE(mixed->size() == 4);
  CHECK(mixed->files_opened() == 0);
  for (int64_t i = 0; i < 4; ++i) CHECK(same_sample(plain->read(i), mixed->read(i)));
  // Tokens only: the same ids and mask.
  const TokenSample t = mixed->read_tokens_only(0);
  CHECK(at::equal(t.input_ids, plain->read(0).input_ids));
  // Bytes read are the compressed bytes.
  CHECK(mixed->bytes_read() > 0);

  // Several gzip members are one stream (as gzip -d reads them).
  const std::vector<char> raw = torch_save_bytes(make_sample(7, 4, 9));
  std::vector<char> two = gzip_bytes(std::vector<char>(raw.begin(), raw.begin() + 100));
  const std::vector<char> rest = gzip_bytes(std::vector<char>(raw.begin() + 100, raw.end()));
  two.insert(two.end(), rest.begin(), rest.end());
  CHECK(fsdp::gunzip_bytes(two) == raw);
}

TEST_CASE("gzip: damaged files are errors naming the file", "[data][gzip]") {
  const auto dir = temp_dir("gz_bad");
  const std::vector<char> raw = torch_save_bytes(make_sample(6, 4, 1));
  const std::vector<char> gz = gzip_bytes(raw);
  struct Case {
    const char* name;
    std::vector<char> bytes;
    const char* expect;
  };
  std::vector<char> flipped = gz;
  flipped[gz.size() / 2] ^= 0x5a;
  std::vector<char> crc = gz;
  crc[gz.size() - 6] ^= 0x01;  // the CRC-32 of the trailer
  const std::vector<Case> cases = {
      {"truncated", std::vector<char>(gz.begin(), gz.begin() + gz.size() / 2), "truncated gzip"},
      {"no trailer", std::vector<char>(gz.begin(), gz.end() - 8), "truncated gzip"},
      {"corrupt", flipped, "cannot decompress"},
      {"crc", crc, "cannot decompress"},
      {"not gzip", raw, "not gzip data"},
      {"short", std::vector<char>(gz.begin(), gz.begin() + 5), "too short for gzip"},
      {"gzip of text", gzip_bytes(std::vector<char>(400, 'x')),
       "decompressed content is not a torch.save zip archive"},
      {"gzip of a truncated zip",
       gzip_bytes(std::vector<char>(raw.begin(), raw.begin() + raw.size() - 30)),
       "cannot load torch.save archive"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const fs::path p = dir / fsdp::str(c.name, ".ckpt.gz");
    write_bytes(p, c.bytes);
    const std::string msg = error_of([&] { read_ckpt_sample(p.string()); });
    CHECK(msg.find(c.expect) != std::string::npos);
    CHECK(msg.find(p.string()) != std::string::npos);
  }
  // The expansion ceiling: a small file may not expand without bound.
  fsdp::GzipLimits tight;
  tight.max_output = 1000;
  CHECK_THROWS_WITH(fsdp::gunzip_bytes(gz, tight), Catch::Contains("expands past the limit"));
}

TEST_CASE("fp8: quantisation error stays within E4M3's bound, per row and layer", "[data][fp8]") {
  at::manual_seed(3);
  // Rows of very different magnitudes, per captured layer, plus a zero row and a zero layer.
  at::Tensor x =
      at::randn({64, 3 * 32}) * at::pow(10.0, at::randint(-4, 4, {64, 3, 1}).to(at::kFloat))
                                    .reshape({64, 3, 1})
                                    .expand({64, 3, 32})
                                    .reshape({64, 96});
  x[5] = 0;
  x[7].narrow(0, 32, 32).zero_();
  x = x.to(at::kBFloat16);
  const Fp8Rows q = quantize_fp8_rows(x, 3);
  CHECK(q.q.scalar_type() == at::kFloat8_e4m3fn);
  CHECK(q.scale.sizes() == at::IntArrayRef({64, 3}));
  const at::Tensor back = dequantize_fp8_rows(q.q, q.scale, "t", "aux_hidden_state");
  CHECK(back.scalar_type() == at::kBFloat16);
  // The one-pass loop equals the tensor-op reference bit for bit, on every fp8 byte value too.
  CHECK(at::equal(back, dequantize_fp8_rows_reference(q.q, q.scale)));
  const at::Tensor all_bytes = at::arange(256, at::kByte).view({4, 64});
  const at::Tensor all = all_bytes.view(at::kFloat8_e4m3fn);
  const at::Tensor sc = at::tensor({1.0f, 0.5f, 3.0f, 1e-3f, 7.0f, 0.25f, 1e4f, 2.0f}).view({4, 2});
  const at::Tensor fast = dequantize_fp8_rows(all, sc, "t", "k");
  const at::Tensor ref = dequantize_fp8_rows_reference(all, sc);
  CHECK(at::equal(fast.isnan(), ref.isnan()));
  CHECK(at::equal(at::nan_to_num(fast), at::nan_to_num(ref)));
  const at::Tensor xf = x.to(at::kFloat), bf = back.to(at::kFloat);
  // |x - x'| <= 2^-4 |x| (3 mantissa bits, round to nearest) + scale * 2^-10 (subnormal step / 2),
  // then bf16 rounding of the result (2^-8 relative).
  const at::Tensor scale = q.scale.repeat_interleave(32, 1);
  const at::Tensor bound = (std::pow(2.0, -4) + std::pow(2.0, -8)) * xf.abs() +
                           scale * std::pow(2.0, -10) * (1 + std::pow(2.0, -8));
  CHECK(((xf - bf).abs() <= bound + 1e-30).all().item<bool>());
  CHECK(at::equal(back[5], x[5]));  // zero rows stay exactly zero
  // The largest element of each row group maps to 448 exactly, so it comes back within 2^-4.
  const at::Tensor amax = xf.reshape({64, 3, 32}).abs().amax(-1);
  CHECK(at::allclose(q.scale, at::where(amax > 0, amax / 448.0, at::ones_like(amax))));
}

TEST_CASE("fp8: bad scales are bad samples naming the key", "[data][fp8]") {
  const Fp8Rows q = quantize_fp8_rows(at::randn({4, 8}), 2);
  CHECK(error_of([&] {
          dequantize_fp8_rows(q.q, at::Tensor(), "f[0]", "hidden_state");
        }).find("scale is missing") != std::string::npos);
  at::Tensor nan = q.scale.clone();
  nan[1][0] = NAN;
  CHECK(error_of([&] {
          dequantize_fp8_rows(q.q, nan, "f[0]", "hidden_state");
        }).find("not finite and positive") != std::string::npos);
  at::Tensor zero = q.scale.clone();
  zero[0][1] = 0;
  CHECK(error_of([&] {
          dequantize_fp8_rows(q.q, zero, "f[0]", "hidden_state");
        }).find("not finite and positive") != std::string::npos);
  CHECK(error_of([&] {
          dequantize_fp8_rows(q.q, q.scale.narrow(0, 0, 3), "f[0]", "x");
        }).find("expected fp32 [4, G]") != std::string::npos);
  CHECK_NOTHROW(dequantize_fp8_rows(q.q, q.scale, "f", "k"));
}

TEST_CASE("fp8: native fp8 shards hold about half the bytes and read back within the bound",
          "[data][fp8]") {
  const auto dir = temp_dir("fp8_native");
  for (int i = 0; i < 6; ++i)
    write_ckpt(dir / "ckpt" / fsdp::str("data_", i, ".ckpt"), make_sample(20 + i, 64, i));
  ConvertOptions o;
  o.input = (dir / "ckpt").string();
  o.output = (dir / "bf16").string();
  const auto bf = convert_to_native(o);
  o.output = (dir / "fp8").string();
  o.dtype = "fp8_e4m3";
  const auto f8 = convert_to_native(o);
  // Hidden bytes halve; ids and masks (16 bytes a token) and scales (16 bytes a token) do not.
  CHECK(static_cast<double>(f8.bytes_written) < 0.62 * static_cast<double>(bf.bytes_written));
  auto ref = open_feature_dataset(o.input);
  auto ds = open_feature_dataset(o.output);
  REQUIRE(ds->size() == 6);
  for (int64_t i = 0; i < 6; ++i) {
    const RawSample a = ref->read(i), b = ds->read(i);
    CHECK(at::equal(a.input_ids, b.input_ids));
    CHECK(at::equal(a.loss_mask, b.loss_mask));
    for (const auto& [x, y] : {std::pair{a.hidden_state, b.hidden_state},
                               std::pair{a.aux_hidden_state, b.aux_hidden_state}}) {
      const at::Tensor xf = x.to(at::kFloat), yf = y.to(at::kFloat);
      CHECK(((xf - yf).abs() <= 0.07 * xf.abs() + 0.07 * xf.abs().amax(-1, true) / 448)
                .all()
                .item<bool>());
    }
  }
  // Resuming the conversion with the other dtype rewrites every shard.
  o.dtype = "bf16";
  const auto again = convert_to_native(o);
  CHECK(again.shards_written == again.shards_total);
  CHECK(same_sample(open_feature_dataset(o.output)->read(2), ref->read(2)));
}

TEST_CASE("final norm: pre-norm features get the target's RMSNorm as transformers computes it",
          "[data]") {
  at::manual_seed(1);
  const at::Tensor h = (at::randn({5, 16}) * 3).to(at::kBFloat16);
  const at::Tensor w = (at::rand({16}) + 0.5).to(at::kBFloat16);
  const double eps = 1e-5;
  const at::Tensor got = apply_final_norm(h, w, eps);
  // Reference in fp64 with the same two roundings (normed to bf16, then times the bf16 weight).
  const at::Tensor x = h.to(at::kDouble);
  const at::Tensor normed = (x / at::sqrt(x.pow(2).mean(-1, true) + eps)).to(at::kBFloat16);
  const at::Tensor want = (w.to(at::kDouble) * normed.to(at::kDouble)).to(at::kBFloat16);
  CHECK((got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() <=
        std::pow(2.0, -7) * want.to(at::kDouble).abs().max().item<double>());
}

TEST_CASE("vocab mapping: the dump's own vocab_mapping.pt is used when its sizes fit",
          "[data][vocab]") {
  const auto dir = temp_dir("dump_mapping");
  for (int i = 0; i < 3; ++i)
    write_ckpt(dir / "rows_0-2000" / fsdp::str("data_", i, ".ckpt"), make_sample(6, 4, i));
  auto ds = open_feature_dataset(dir.string());
  // A mapping that differs from the counted one, so using it is visible.
  VocabMapping theirs;
  theirs.d2t = at::tensor({0, 0, 10, 10}, at::kLong);  // ids 0, 1, 12, 13
  theirs.t2d = at::zeros({16}, at::kBool);
  for (int64_t id : {0, 1, 12, 13}) theirs.t2d[id] = true;
  fs::create_directories(dir / "vocab_mapping");
  save_vocab_mapping((dir / "vocab_mapping" / "vocab_mapping.pt").string(), theirs);
  VocabMappingOptions o;
  o.vocab_size = 16;
  o.draft_vocab_size = 4;
  o.max_length = 100;
  CHECK(at::equal(build_vocab_mapping(*ds, o).d2t, theirs.d2t));
  // Other sizes: not used (a warning names both), the mapping is counted from the features.
  o.draft_vocab_size = 3;
  const VocabMapping counted = build_vocab_mapping(*ds, o);
  CHECK(counted.draft_vocab_size() == 3);
  // Turned off: counted even when the sizes fit.
  o.draft_vocab_size = 4;
  o.use_dump_mapping = false;
  CHECK_FALSE(at::equal(build_vocab_mapping(*ds, o).d2t, theirs.d2t));
}
