// DeepSpec target caches written here byte by byte (odd offsets, two shards): the four tensors
// read back bit-equal, opening reads no shard, the tokens-only reader reads no hidden bytes, and
// each damaged manifest, index or shard fails with a message naming the file and the sample.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/formats.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct DsSample {
  at::Tensor ids;   // int32 [S]
  at::Tensor mask;  // uint8 [S]
  at::Tensor aux;   // bf16 [S, L*H]
  at::Tensor last;  // bf16 [S, H]
};

DsSample make_ds_sample(int64_t s, int64_t h, int64_t layers, int64_t tag) {
  DsSample d;
  d.ids = (at::arange(s, at::kInt) * 3 + tag) % 50;
  d.mask = at::ones({s}, at::kByte);
  d.mask[0] = 0;
  d.aux = (at::randn({s, layers * h}) + tag).to(at::kBFloat16);
  d.last = (at::randn({s, h}) - tag).to(at::kBFloat16);
  return d;
}

void put_u64(std::vector<char>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u32(std::vector<char>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void write_file(const fs::path& p, const std::vector<char>& bytes) {
  std::FILE* f = std::fopen(p.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

void append(std::vector<char>& b, const at::Tensor& t) {
  const char* p = static_cast<const char*>(t.contiguous().data_ptr());
  b.insert(b.end(), p, p + t.nbytes());
}

// Writes a cache like DeepSpec's writer: samples back to back in `per_shard`-sample shards, each
// shard starting with one odd padding byte so every offset is unaligned.
json write_cache(const fs::path& dir, const std::vector<DsSample>& samples, int64_t h,
                 const std::vector<int64_t>& layer_ids, size_t per_shard) {
  fs::create_directories(dir);
  std::vector<char> idx;
  json shards = json::array();
  std::vector<char> shard;
  auto flush = [&]() {
    const int64_t k = static_cast<int64_t>(shards.size());
    char name[32];
    std::snprintf(name, sizeof(name), "shard-%05lld.bin", static_cast<long long>(k));
    write_file(dir / name, shard);
    shards.push_back({{"shard_id", k}, {"file_name", name}});
    shard.clear();
  };
  for (size_t i = 0; i < samples.size(); ++i) {
    if (shard.empty()) shard.push_back('\x7f');
    const DsSample& s = samples[i];
    const uint64_t n = static_cast<uint64_t>(s.ids.numel());
    put_u64(idx, i);
    put_u32(idx, static_cast<uint32_t>(shards.size()));
    put_u32(idx, static_cast<uint32_t>(n));
    put_u64(idx, shard.size());
    append(shard, s.ids);
    put_u64(idx, shard.size());
    append(shard, at::ones({static_cast<int64_t>(n)}, at::kByte));
    put_u64(idx, shard.size());
    append(shard, s.mask);
    put_u64(idx, shard.size());
    append(shard, s.aux);
    put_u64(idx, shard.size());
    append(shard, s.last);
    if ((i + 1) % per_shard == 0 || i + 1 == samples.size()) flush();
  }
  write_file(dir / "samples.idx", idx);
  json m = {{"version", 2},
            {"num_samples", samples.size()},
            {"num_shards", shards.size()},
            {"target_layer_ids", layer_ids},
            {"hidden_dtype", "bfloat16"},
            {"token_dtype", "int32"},
            {"mask_dtype", "uint8"},
            {"index_record_size", 56},
            {"hidden_size", h},
            {"shards", shards},
            {"target_model_name_or_path", "toy/target"},
            {"max_length", 2048}};
  std::ofstream(dir / "manifest.json") << m.dump(2);
  return m;
}

std::vector<DsSample> three_samples(int64_t h, int64_t layers) {
  return {make_ds_sample(5, h, layers, 1), make_ds_sample(7, h, layers, 2),
          make_ds_sample(3, h, layers, 3)};
}

DatasetOptions opts(int64_t layers) {
  DatasetOptions o;
  o.num_aux_layers = layers;
  return o;
}

// Overwrites 8 bytes of samples.idx at record `i`, field byte offset `at`.
void patch_idx(const fs::path& dir, int64_t i, int at, uint64_t v) {
  std::fstream f(dir / "samples.idx", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(i * 56 + at);
  std::vector<char> b;
  if (at == 8 || at == 12)
    put_u32(b, static_cast<uint32_t>(v));
  else
    put_u64(b, v);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST_CASE("deepspec: the four tensors read back bit-equal; opening reads no shard", "[deepspec]") {
  const auto dir = temp_dir("deepspec_ok");
  const int64_t h = 8;
  const auto samples = three_samples(h, 3);
  write_cache(dir, samples, h, {2, 5, 9}, 2);
  REQUIRE(is_deepspec_cache(dir.string()));
  CHECK_FALSE(is_deepspec_cache((dir / "shard-00000.bin").string()));

  const auto ds = open_deepspec_dataset(dir.string(), opts(3));
  CHECK(ds->files_opened() == 0);
  CHECK(ds->bytes_read() == 0);
  CHECK(ds->format() == "deepspec");
  CHECK(ds->size() == 3);
  CHECK(ds->root() == dir.string());
  CHECK(ds->captured_layer_ids() == std::vector<int64_t>{2, 5, 9});
  CHECK_FALSE(ds->hidden_state_prenorm());
  CHECK(ds->source_key(0) == "shard-00000.bin[0]");
  CHECK(ds->source_key(2) == "shard-00001.bin[2]");
  CHECK(ds->source(1).find("shard-00000.bin (sample 1)") != std::string::npos);
  // 4 + 1 + 1 bytes of tokens and masks and 2 x (3 + 1) x 8 bytes of hidden states per token.
  CHECK(ds->source_bytes(1) == 7 * (6 + 64));

  for (int64_t i = 0; i < 3; ++i) {
    const DsSample& s = samples[i];
    const RawSample want =
        validate_sample(s.ids, s.mask, s.last, s.aux, "reference", DatasetOptions{});
    const RawSample got = ds->read(i);
    CHECK(got.source == ds->source(i));
    CHECK(at::equal(got.input_ids, want.input_ids));
    CHECK(at::equal(got.loss_mask, want.loss_mask));
    CHECK(got.hidden_state.scalar_type() == at::kBFloat16);
    CHECK(at::equal(got.hidden_state, want.hidden_state));
    CHECK(at::equal(got.aux_hidden_state, want.aux_hidden_state));
    const TokenSample t = ds->read_tokens(i);
    CHECK(at::equal(t.input_ids, want.input_ids));
  }
  CHECK(ds->files_opened() == 2);  // two shards, kept open in the LRU

  // Tokens only: 4 + 1 bytes a token, none of the hidden-state bytes.
  const auto fresh = open_deepspec_dataset(dir.string(), opts(3));
  const TokenSample t = fresh->read_tokens_only(1);
  CHECK(at::equal(t.input_ids, samples[1].ids.to(at::kLong)));
  CHECK(at::equal(t.loss_mask, samples[1].mask.to(at::kLong)));
  CHECK(fresh->bytes_read() == 7 * 5);

  // num_aux_layers 0 (convert): any captured-layer count.
  CHECK(open_deepspec_dataset(dir.string(), opts(0))->read(0).aux_hidden_state.size(1) == 24);
}

TEST_CASE("deepspec: damaged manifests and indexes fail at open, naming the file", "[deepspec]") {
  const auto dir = temp_dir("deepspec_bad_open");
  const int64_t h = 8;
  const auto samples = three_samples(h, 3);
  const json good = write_cache(dir, samples, h, {2, 5, 9}, 2);
  const std::string root = dir.string();
  auto open_error = [&](int64_t layers = 3) {
    return error_of([&] { open_deepspec_dataset(root, opts(layers)); });
  };
  auto with_manifest = [&](const std::function<void(json&)>& edit) {
    json m = good;
    edit(m);
    std::ofstream(dir / "manifest.json", std::ios::trunc) << m.dump();
  };

  with_manifest([](json& m) { m["version"] = 3; });
  std::string e = open_error();
  INFO(e);
  CHECK(e.find("manifest.json: DeepSpec cache version 3 is not supported (expected 2)") !=
        std::string::npos);
  with_manifest([](json& m) { m.erase("hidden_size"); });
  CHECK(open_error().find("manifest.json: missing or non-integer field 'hidden_size'") !=
        std::string::npos);
  with_manifest([](json& m) { m["hidden_dtype"] = "float16"; });
  CHECK(open_error().find("hidden_dtype is 'float16', expected 'bfloat16'") != std::string::npos);
  with_manifest([](json& m) { m["index_record_size"] = 48; });
  CHECK(open_error().find("index_record_size is 48, expected 56") != std::string::npos);
  with_manifest([](json& m) { m["target_layer_ids"] = {9, 2, 5}; });
  CHECK(open_error().find("target_layer_ids is not sorted ascending") != std::string::npos);
  with_manifest([](json& m) { m["shards"][1]["file_name"] = "../elsewhere.bin"; });
  CHECK(open_error().find("is not a file name in the cache directory") != std::string::npos);
  with_manifest([](json& m) { m["num_samples"] = 4; });
  e = open_error();
  INFO(e);
  CHECK(e.find("samples.idx: 168 bytes, but num_samples 4 x 56-byte records is 224") !=
        std::string::npos);
  with_manifest([](json&) {});

  // Layer count against the draft: known from the manifest, so refused before any read.
  e = open_error(4);
  INFO(e);
  CHECK(e.find("the cache holds 3 captured layers (layer ids 2, 5, 9), the draft reads 4") !=
        std::string::npos);

  patch_idx(dir, 1, 0, 7);
  e = open_error();
  INFO(e);
  CHECK(e.find("samples.idx: record 1 holds sample_id 7") != std::string::npos);
  patch_idx(dir, 1, 0, 1);
  patch_idx(dir, 2, 8, 2);
  e = open_error();
  INFO(e);
  CHECK(e.find("samples.idx: sample 2 names shard_id 2 but the manifest lists 2 shards") !=
        std::string::npos);
  patch_idx(dir, 2, 8, 1);
  CHECK_NOTHROW(open_deepspec_dataset(root, opts(3)));
  CHECK_THROWS_AS(open_deepspec_dataset(root, opts(4)), fsdp::UsageError);
}

TEST_CASE("deepspec: a 5-layer cache for a 3-layer draft names both counts", "[deepspec]") {
  const auto dir = temp_dir("deepspec_layers");
  write_cache(dir, three_samples(4, 5), 4, {1, 3, 5, 7, 9}, 3);
  const std::string e = error_of([&] { open_deepspec_dataset(dir.string(), opts(3)); });
  INFO(e);
  CHECK(e.find("the cache holds 5 captured layers (layer ids 1, 3, 5, 7, 9), the draft reads 3") !=
        std::string::npos);
  CHECK(open_deepspec_dataset(dir.string(), opts(5))->read(2).aux_hidden_state.size(1) == 20);
}

TEST_CASE("deepspec: truncated shards and bad records are bad samples naming file and sample",
          "[deepspec]") {
  const auto dir = temp_dir("deepspec_bad_read");
  const int64_t h = 8;
  write_cache(dir, three_samples(h, 3), h, {2, 5, 9}, 2);
  const std::string root = dir.string();

  // The last sample of shard 0 loses its final byte.
  const auto shard0 = dir / "shard-00000.bin";
  fs::resize_file(shard0, fs::file_size(shard0) - 1);
  auto ds = open_deepspec_dataset(root, opts(3));
  CHECK_NOTHROW(ds->read(0));
  CHECK_THROWS_AS(ds->read(1), BadSampleError);
  std::string e = error_of([&] { ds->read(1); });
  INFO(e);
  CHECK(e.find("shard-00000.bin (sample 1): target_last_hidden_states at byte ") !=
        std::string::npos);
  CHECK(e.find("runs past the end of the shard (") != std::string::npos);
  CHECK(error_of([&] { ds->read_tokens_only(1); }).find("runs past the end") != std::string::npos);

  // An offset near 2^64: the range check must not wrap around.
  patch_idx(dir, 2, 40, ~uint64_t{0} - 3);
  ds = open_deepspec_dataset(root, opts(3));
  e = error_of([&] { ds->read(2); });
  INFO(e);
  CHECK(e.find("shard-00001.bin (sample 2): target_hidden_states at byte 18446744073709551612") !=
        std::string::npos);

  patch_idx(dir, 0, 12, 0);
  ds = open_deepspec_dataset(root, opts(3));
  e = error_of([&] { ds->read(0); });
  CHECK(e.find("shard-00000.bin (sample 0): seq_len is 0") != std::string::npos);

  // A shard that is gone: a bad sample (not retried), naming it.
  fs::remove(dir / "shard-00001.bin");
  CHECK_THROWS_AS(ds->read(2), BadSampleError);
  e = error_of([&] { ds->read(2); });
  INFO(e);
  CHECK(e.find("shard-00001.bin (sample 2): cannot open (No such file or directory)") !=
        std::string::npos);
}
