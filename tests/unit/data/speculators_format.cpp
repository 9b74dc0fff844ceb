// speculators dumps (hs_<i>.safetensors + the preprocessed Arrow dataset) read as SpecForge
// samples: the layer split, fp8 dequantisation as speculators does it, the loss mask from the
// Arrow row, and each broken input refused as a bad sample (or at open) with its own message.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "arrow_test_bytes.h"
#include "checkpoint/safetensors.h"
#include "data/formats.h"
#include "support/test_paths.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;
using fsdp::checkpoint::write_safetensors;

namespace {

constexpr int64_t kH = 8;
// The rows of kGoodStream's input_ids and loss_mask.
const std::vector<std::vector<int64_t>> kIds = {{5, 6, 7}, {8, 9}, {10, 11, 12, 13}};
const std::vector<std::vector<int64_t>> kMasks = {{0, 1, 1}, {1, 1}, {0, 0, 1, 1}};

at::Tensor ids_of(size_t row) {
  return at::tensor(kIds[row], at::kLong);
}

// [S, L, H] bf16 values that identify the row, token, layer and column.
at::Tensor hidden_of(size_t row, int64_t layers) {
  const int64_t s = static_cast<int64_t>(kIds[row].size());
  return ((at::arange(s * layers * kH, at::kFloat).view({s, layers, kH}) / 16.0) + row * 100.0)
      .to(at::kBFloat16);
}

void write_dataset(const fs::path& dir, const char* stream = kGoodStream) {
  const std::string bytes = from_hex(stream);
  write_bytes(dir / "data-00000-of-00001.arrow", std::vector<char>(bytes.begin(), bytes.end()));
  std::ofstream(dir / "state.json")
      << R"({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})";
  std::ofstream(dir / "dataset_info.json") << "{}";
}

void write_hs(const fs::path& hs_dir, size_t row, fsdp::checkpoint::NamedTensors extra = {},
              int64_t layers = 4) {
  fs::create_directories(hs_dir);
  fsdp::checkpoint::NamedTensors t = {{"token_ids", ids_of(row)},
                                      {"hidden_states", hidden_of(row, layers)}};
  for (auto& e : extra) {
    bool replaced = false;
    for (auto& x : t)
      if (x.first == e.first) x.second = e.second, replaced = true;
    if (!replaced) t.push_back(e);
  }
  write_safetensors((hs_dir / fsdp::str("hs_", row, ".safetensors")).string(), t);
}

// speculators' default layout: <dir>/hidden_states/hs_<i>.safetensors beside the dataset.
fs::path default_dump(const std::string& name) {
  const auto dir = temp_dir(name);
  write_dataset(dir);
  for (size_t r = 0; r < 3; ++r) write_hs(dir / "hidden_states", r);
  return dir / "hidden_states";
}

}  // namespace

TEST_CASE("speculators: hs files read as SpecForge samples, loss mask from the Arrow row",
          "[speculators]") {
  const auto hs = default_dump("spec_good");
  CHECK(is_speculators_dump(hs.string()));
  CHECK_FALSE(is_speculators_dump(hs.parent_path().string()));
  const auto ds = open_speculators_dataset(hs.string(), {});
  CHECK(ds->format() == "speculators");
  CHECK(ds->hidden_state_prenorm());
  REQUIRE(ds->size() == 3);
  CHECK(ds->files_opened() == 0);
  CHECK(ds->source_key(1) == "hs_1.safetensors");
  CHECK(ds->source(1) == (hs / "hs_1.safetensors").string());
  CHECK(ds->source_bytes(1) == fs::file_size(hs / "hs_1.safetensors"));
  for (size_t r = 0; r < 3; ++r) {
    const RawSample s = ds->read(static_cast<int64_t>(r));
    const at::Tensor x = hidden_of(r, 4);
    const int64_t n = x.size(0);
    CHECK(s.input_ids.equal(ids_of(r)));
    CHECK(s.loss_mask.equal(at::tensor(kMasks[r], at::kLong)));
    CHECK(s.hidden_state.equal(x.select(1, 3)));
    CHECK(s.aux_hidden_state.equal(x.narrow(1, 0, 3).reshape({n, 3 * kH})));
  }
  CHECK(ds->files_opened() == 3);
  // The tokens-only reader checks token_ids but never reads hidden_states' bytes.
  const uint64_t before = ds->bytes_read();
  const TokenSample t = ds->read_tokens_only(2);
  CHECK(t.loss_mask.equal(at::tensor(kMasks[2], at::kLong)));
  CHECK(ds->bytes_read() - before < 200);
  CHECK(ds->read_tokens(0).input_ids.equal(ids_of(0)));
  CHECK(open_feature_dataset(hs.string())->format() == "speculators");
}

TEST_CASE("speculators: the dataset may sit beside the hs files; a missing one names both places",
          "[speculators]") {
  const auto dir = temp_dir("spec_flat");
  write_dataset(dir);
  write_hs(dir, 0);
  write_hs(dir, 2);  // a row without hidden states is not a sample
  const auto ds = open_speculators_dataset(dir.string(), {});
  REQUIRE(ds->size() == 2);
  CHECK(ds->source_key(1) == "hs_2.safetensors");
  CHECK(ds->read(1).input_ids.equal(ids_of(2)));

  const auto lonely = temp_dir("spec_lonely");
  write_hs(lonely / "hidden_states", 0);
  const std::string e =
      error_of([&] { open_speculators_dataset((lonely / "hidden_states").string(), {}); });
  CHECK_THAT(e, Catch::Contains("no preprocessed dataset"));
  CHECK_THAT(e, Catch::Contains((lonely / "hidden_states").string() + " and " + lonely.string()));
  CHECK_THAT(e, Catch::Contains("loss_mask"));

  fs::copy_file(dir / "hs_0.safetensors", dir / "hs_7.safetensors");  // the dataset has 3 rows
  CHECK_THAT(error_of([&] { open_speculators_dataset(dir.string(), {}); }),
             Catch::Contains("hs_7.safetensors but the dataset in"));
}

TEST_CASE("speculators: a dataset without loss_mask is refused at open", "[speculators]") {
  const auto dir = temp_dir("spec_nomask");
  write_dataset(dir, kBadStream);
  write_hs(dir / "hidden_states", 0);
  CHECK_THAT(error_of([&] { open_speculators_dataset((dir / "hidden_states").string(), {}); }),
             Catch::Contains("no 'loss_mask' column (it has text: string, input_ids: "
                             "list<int64>)"));
}

TEST_CASE("speculators: token mismatch, lock, partial file and layer count are bad samples",
          "[speculators]") {
  const auto hs = default_dump("spec_bad");
  write_hs(hs, 0, {{"token_ids", at::tensor(std::vector<int64_t>{5, 6, 8}, at::kLong)}});
  write_hs(hs, 1, {{"token_ids", at::tensor(std::vector<int64_t>{8}, at::kLong)}});
  const auto ds = open_speculators_dataset(hs.string(), {});
  CHECK_THROWS_AS(ds->read(0), BadSampleError);
  CHECK_THAT(error_of([&] { ds->read(0); }),
             Catch::Contains("token_ids differ from input_ids of row 0 of the dataset in " +
                             hs.parent_path().string() + " at position 2 (8 vs 7)"));
  CHECK_THAT(error_of([&] { ds->read_tokens_only(1); }),
             Catch::Contains("token_ids has 1 tokens, input_ids of row 1"));

  std::ofstream(hs / "hs_2.safetensors.lock") << "";
  CHECK_THROWS_AS(ds->read(2), SampleReadError);
  fs::remove(hs / "hs_2.safetensors.lock");
  CHECK(ds->read(2).length() == 4);
  fs::resize_file(hs / "hs_2.safetensors", 40);
  try {
    ds->read(2);
    FAIL("a partial file was read");
  } catch (const SampleReadError&) {
    FAIL("a partial file is not a transient read error");
  } catch (const BadSampleError& e) {
    CHECK_THAT(e.message(), Catch::Contains("hs_2.safetensors"));
  }

  write_hs(hs, 2, {}, 3);  // two auxiliary layers
  CHECK_THAT(error_of([&] { ds->read(2); }),
             Catch::Contains("hidden_states holds 3 captured layers (2 auxiliary + the last), "
                             "the draft reads 3 auxiliary layers"));
  DatasetOptions any;
  any.num_aux_layers = 0;
  CHECK(open_speculators_dataset(hs.string(), any)->read(2).aux_hidden_state.size(1) == 2 * kH);
}

TEST_CASE("speculators: fp8 hidden states dequantised in bf16 with per-token scales",
          "[speculators]") {
  const auto hs = default_dump("spec_fp8");
  const at::Tensor x = hidden_of(2, 4);
  const at::Tensor q = x.to(at::kFloat8_e4m3fn);
  const at::Tensor scale = at::tensor(std::vector<float>{0.5f, 1.25f, 3.0f, 0.01f}).view({4, 1, 1});
  const auto ds = open_speculators_dataset(hs.string(), {});
  for (const at::Tensor& s : {scale, scale.view({4, 1}), scale.narrow(0, 1, 1).reshape({1})}) {
    write_hs(hs, 2, {{"hidden_states", q}, {"hidden_states_scales", s.contiguous()}});
    const at::Tensor want = q.to(at::kBFloat16) * s.view({-1, 1, 1}).to(at::kBFloat16);
    const RawSample r = ds->read(2);
    CHECK(r.hidden_state.equal(want.select(1, 3)));
    CHECK(r.aux_hidden_state.equal(want.narrow(1, 0, 3).reshape({4, 3 * kH})));
  }
  const std::string file = (hs / "hs_2.safetensors").string();
  write_hs(hs, 2, {{"hidden_states", q}});
  CHECK_THAT(error_of([&] { ds->read(2); }),
             Catch::Contains(file + ": fp8 hidden_states without 'hidden_states_scales'"));
  for (const float bad : {std::nanf(""), 0.0f, -1.0f, INFINITY}) {
    at::Tensor s = scale.clone();
    s[1][0][0] = bad;
    write_hs(hs, 2, {{"hidden_states", q}, {"hidden_states_scales", s}});
    CHECK_THROWS_AS(ds->read(2), BadSampleError);
    CHECK_THAT(error_of([&] { ds->read(2); }),
               Catch::Contains(file + ": hidden_states_scales holds a scale that is not finite"));
  }
  write_hs(hs, 2, {{"hidden_states", q}, {"hidden_states_scales", at::ones({2, 2})}});
  CHECK_THAT(error_of([&] { ds->read(2); }),
             Catch::Contains("hidden_states_scales has shape [2, 2], expected [4,1,1]"));
}

// The fixture script (pyarrow, datasets, safetensors) against the .ckpt files it writes beside:
// bit for bit, bf16 and fp8. Needs the venv's Python with those packages (launch/setup.sh
// installs them): without them the test fails rather than pass unchecked.
TEST_CASE("speculators: the Python fixture reads as the .ckpt files it wrote", "[speculators]") {
  if (!have_python() || std::system((std::string(FSDP_PYTHON) +
                                     " -c 'import datasets, pyarrow, safetensors' >/dev/null 2>&1")
                                        .c_str()) != 0) {
    FAIL("FSDP_PYTHON lacks datasets/pyarrow/safetensors: run launch/setup.sh");
  }
  for (const char* flags : {"", "--fp8"}) {
    INFO("flags: " << flags);
    const auto dir = temp_dir("spec_py");
    const std::string cmd =
        fsdp::str(FSDP_PYTHON, " ", FSDP_SOURCE_DIR, "/tests/data/make_speculators_fixture.py ",
                  dir.string(), " ", flags, " >/dev/null 2>&1");
    REQUIRE(std::system(cmd.c_str()) == 0);
    const auto ds = open_speculators_dataset((dir / "preprocessed" / "hidden_states").string(), {});
    REQUIRE(ds->size() == 6);
    for (int64_t i = 0; i < ds->size(); ++i) {
      const RawSample got = ds->read(i);
      const RawSample want =
          read_ckpt_sample((dir / "ckpt" / fsdp::str("data_", i, ".ckpt")).string());
      CHECK(got.input_ids.equal(want.input_ids));
      CHECK(got.loss_mask.equal(want.loss_mask));
      CHECK(got.hidden_state.equal(want.hidden_state));
      CHECK(got.aux_hidden_state.equal(want.aux_hidden_state));
    }
  }
}
