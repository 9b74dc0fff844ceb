// SpecForge .ckpt reading: accepted variants, and a table of corrupt inputs, each with its own
// message naming the file; the loader's skip mode counts them instead of stopping.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "core/zip_reader.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;

TEST_CASE("a valid .ckpt reads back with the reference's dtypes and shapes", "[data]") {
  const auto dir = temp_dir("ckpt_ok");
  write_ckpt(dir / "a.ckpt", make_sample(6, 4, 3));
  const RawSample s = read_ckpt_sample((dir / "a.ckpt").string());
  CHECK(s.length() == 6);
  CHECK(s.hidden_size() == 4);
  CHECK(s.input_ids.scalar_type() == at::kLong);
  CHECK(s.hidden_state.sizes() == at::IntArrayRef({6, 4}));
  CHECK(s.aux_hidden_state.sizes() == at::IntArrayRef({6, 12}));
  const auto ref = make_sample(6, 4, 3);
  CHECK(at::equal(s.input_ids, ref.at("input_ids")));
  CHECK(at::equal(s.hidden_state, ref.at("hidden_state")[0]));

  // Accepted variants: [1,S] ids, int32 ids, bool mask, fp32/fp16 hidden (converted to bf16),
  // extra keys ignored.
  auto d = make_sample(5, 4, 0);
  d.insert_or_assign("input_ids", d.at("input_ids").unsqueeze(0).to(at::kInt));
  d.insert_or_assign("loss_mask", d.at("loss_mask").to(at::kBool));
  d.insert_or_assign("hidden_state", d.at("hidden_state").to(at::kFloat));
  d.insert_or_assign("aux_hidden_state", d.at("aux_hidden_state").to(at::kHalf));
  d.insert("extra", at::zeros({2}));
  write_ckpt(dir / "b.ckpt", d);
  const RawSample v = read_ckpt_sample((dir / "b.ckpt").string());
  CHECK(v.input_ids.scalar_type() == at::kLong);
  CHECK(v.input_ids.dim() == 1);
  CHECK(v.loss_mask.scalar_type() == at::kLong);
  CHECK(v.hidden_state.scalar_type() == at::kBFloat16);
  CHECK(v.aux_hidden_state.scalar_type() == at::kBFloat16);
}

TEST_CASE("corrupt .ckpt inputs each give their own message", "[data]") {
  const auto dir = temp_dir("ckpt_bad");
  using Dict = c10::Dict<std::string, at::Tensor>;
  auto with = [](const std::string& key, const at::Tensor& t) {
    Dict d = make_sample(6, 4, 0);
    d.insert_or_assign(key, t);
    return d;
  };
  auto without = [](const std::string& key) {
    Dict d = make_sample(6, 4, 0);
    (void)d.erase(key);
    return d;
  };
  struct Case {
    std::string name;
    std::function<void(const fs::path&)> make;
    std::string expect;
  };
  const at::Tensor nan_hidden = [] {
    at::Tensor t = at::zeros({1, 6, 4}, at::kBFloat16);
    t[0][2][1] = std::numeric_limits<float>::quiet_NaN();
    return t;
  }();
  const at::Tensor inf_aux = [] {
    at::Tensor t = at::zeros({1, 6, 12}, at::kBFloat16);
    t[0][5][11] = std::numeric_limits<float>::infinity();
    return t;
  }();
  const std::vector<Case> cases = {
      {"missing key", [&](auto p) { write_ckpt(p, without("aux_hidden_state")); },
       "missing key 'aux_hidden_state'"},
      {"float ids", [&](auto p) { write_ckpt(p, with("input_ids", at::zeros({6}))); },
       "input_ids has dtype fp32"},
      {"int hidden",
       [&](auto p) {
         write_ckpt(p, with("hidden_state", at::zeros({1, 6, 4}, at::kLong)));
       },
       "hidden_state has dtype int64"},
      {"3-d ids",
       [&](auto p) {
         write_ckpt(p, with("input_ids", at::zeros({2, 3, 1}, at::kLong)));
       },
       "input_ids has shape"},
      {"2-row hidden",
       [&](auto p) {
         write_ckpt(p, with("hidden_state", at::zeros({2, 6, 4}, at::kBFloat16)));
       },
       "hidden_state has shape"},
      {"lengths", [&](auto p) { write_ckpt(p, with("loss_mask", at::ones({5}, at::kLong))); },
       "lengths disagree"},
      {"aux width",
       [&](auto p) {
         write_ckpt(p, with("aux_hidden_state", at::zeros({1, 6, 8}, at::kBFloat16)));
       },
       "aux_hidden_state holds 2 captured layers (width 8 = 2 x 4), the draft reads 3"},
      {"aux width not a multiple",
       [&](auto p) {
         write_ckpt(p, with("aux_hidden_state", at::zeros({1, 6, 7}, at::kBFloat16)));
       },
       "aux_hidden_state has width 7, expected 3 x 4"},
      {"mask values",
       [&](auto p) { write_ckpt(p, with("loss_mask", at::full({6}, 2, at::kLong))); },
       "loss_mask has values other than 0 and 1"},
      {"negative id",
       [&](auto p) { write_ckpt(p, with("input_ids", at::full({6}, -3, at::kLong))); },
       "negative id"},
      {"NaN", [&](auto p) { write_ckpt(p, with("hidden_state", nan_hidden)); },
       "hidden_state contains NaN or Inf"},
      {"Inf", [&](auto p) { write_ckpt(p, with("aux_hidden_state", inf_aux)); },
       "aux_hidden_state contains NaN or Inf"},
      {"empty",
       [&](auto p) {
         Dict d;
         d.insert("input_ids", at::zeros({0}, at::kLong));
         d.insert("loss_mask", at::zeros({0}, at::kLong));
         d.insert("hidden_state", at::zeros({1, 0, 4}, at::kBFloat16));
         d.insert("aux_hidden_state", at::zeros({1, 0, 12}, at::kBFloat16));
         write_ckpt(p, d);
       },
       "S = 0"},
      {"not a dict",
       [&](auto p) { write_bytes(p, torch::pickle_save(c10::IValue(at::zeros({2})))); },
       "expected a dict"},
      {"truncated",
       [&](auto p) {
         auto bytes = torch::pickle_save(c10::IValue(make_sample(6, 4, 0)));
         bytes.resize(bytes.size() / 2);
         write_bytes(p, bytes);
       },
       "cannot load torch.save archive"},
      {"not zip",
       [&](auto p) {
         write_bytes(p, {'h', 'e', 'l', 'l', 'o'});
       },
       "not a torch.save zip"},
      {"legacy",
       [&](auto p) {
         write_bytes(p, {'\x80', '\x02', 'x', 'y'});
       },
       "legacy (non-zip)"},
      {"tiny", [&](auto p) { write_bytes(p, {'P'}); }, "only 1 bytes"},
  };
  DatasetOptions strict;
  for (const auto& c : cases) {
    INFO(c.name);
    const auto p = dir / "bad" / (c.name + ".ckpt");
    c.make(p);
    std::string msg;
    try {
      read_ckpt_sample(p.string(), strict);
      msg = "<no error>";
    } catch (const BadSampleError& e) {
      msg = e.message();
    }
    CHECK(msg.find(c.expect) != std::string::npos);
    CHECK(msg.find(p.string()) != std::string::npos);
  }
  // Options: id range and hidden size checks.
  write_ckpt(dir / "ok.ckpt", make_sample(6, 4, 10));
  CHECK(error_of([&] {
          read_ckpt_sample((dir / "ok.ckpt").string(), {12, 0, true});
        }).find("id 15 >= vocab_size 12") != std::string::npos);
  CHECK(error_of([&] {
          read_ckpt_sample((dir / "ok.ckpt").string(), {0, 8, true});
        }).find("hidden size 4") != std::string::npos);

  // Skip mode: a dataset of the corrupt files plus good ones; every bad one is counted, the
  // batches keep their shape with empty rows, and the summary names each file.
  for (int i = 0; i < 4; ++i)
    write_ckpt(dir / "bad" / ("good_" + std::to_string(i) + ".ckpt"), make_sample(6, 4, i));
  auto ds = open_feature_dataset((dir / "bad").string());
  const int64_t n = ds->size();
  REQUIRE(n == static_cast<int64_t>(cases.size()) + 4);
  LoaderOptions lo;
  lo.skip_bad_samples = true;
  DataLoader loader(ds, DistributedSampler(n, 0, 1, 2, 0), lo);
  loader.start({0, 0});
  int64_t rows = 0, skipped = 0;
  while (auto b = loader.next()) {
    rows += b->batch_size();
    skipped += b->num_skipped;
    for (int64_t r = 0; r < b->batch_size(); ++r) CHECK(b->aux_hidden.size(2) == 12);
  }
  CHECK(rows == (n / 2) * 2);
  CHECK(loader.stats().bad_samples == skipped);
  CHECK(skipped >= static_cast<int64_t>(cases.size()) - 1);  // at most one lost in the tail
  const std::string summary = loader.bad_sample_summary();
  CHECK(summary.find("skipped " + std::to_string(skipped) + " bad sample") != std::string::npos);
  CHECK(summary.find("lengths disagree") != std::string::npos);

  // Strict mode: the first bad batch rethrows, naming the file.
  lo.skip_bad_samples = false;
  DataLoader strict_loader(ds, DistributedSampler(n, 0, 1, n, 0), lo);
  strict_loader.start({0, 0});
  CHECK_THROWS_AS(strict_loader.next(), BadSampleError);
  CHECK_FALSE(strict_loader.next().has_value());  // the failed batch was the epoch's only one
}

TEST_CASE("missing files and bad content are bad samples, not retried read errors", "[data]") {
  const auto dir = temp_dir("ckpt_missing");
  const std::string path = (dir / "data_0.ckpt").string();
  CHECK_THROWS_WITH(read_ckpt_sample(path, {}), Catch::Contains("cannot open (No such file"));
  try {
    read_ckpt_sample(path, {});
  } catch (const SampleReadError&) {
    FAIL("a missing file taken for a transient read error");
  } catch (const BadSampleError&) {
  }
  std::ofstream(path) << "not a zip";
  try {
    read_ckpt_sample(path, {});
    FAIL("no error");
  } catch (const SampleReadError&) {
    FAIL("bad content taken for a read error");
  } catch (const BadSampleError& e) {
    CHECK(e.message().find("zip") != std::string::npos);
  }
}

TEST_CASE("a .ckpt cut short anywhere is a bad sample naming the file, never a crash", "[data]") {
  // LibTorch's zip reader reads past the buffer of some truncated archives (SIGSEGV, seen for
  // cuts between 43% and 99% of a file): the archive's records are checked first.
  const auto dir = temp_dir("ckpt_cut");
  const auto whole = dir / "whole.ckpt";
  write_ckpt(whole, make_sample(64, 16, 3));
  std::string bytes;
  {
    std::ifstream in(whole, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(fsdp::zip_archive_problem(std::vector<char>(bytes.begin(), bytes.end())).empty());
  const size_t n = bytes.size();
  int checked = 0;
  for (size_t cut = 1; cut < n; cut += std::max<size_t>(1, n / 97)) {
    const auto path = (dir / "cut.ckpt").string();
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(cut));
    }
    INFO("cut at " << cut << " of " << n << " bytes");
    try {
      read_ckpt_sample(path, {});
      FAIL("a truncated file was read");
    } catch (const BadSampleError& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
    ++checked;
  }
  CHECK(checked > 90);
  // A damaged central directory is caught too.
  std::vector<char> damaged(bytes.begin(), bytes.end());
  const size_t central = bytes.find(std::string("PK\x01\x02", 4));
  REQUIRE(central != std::string::npos);
  damaged[central + 2] = 9;
  CHECK(fsdp::zip_archive_problem(damaged).find("damaged: central directory entry 0") == 0);
}

TEST_CASE("a .ckpt link whose target is gone is listed: a missing sample, not fewer samples",
          "[data]") {
  const auto dir = temp_dir("ckpt_dangling");
  write_ckpt(dir / "a.ckpt", make_sample(6, 4, 0));
  fs::create_symlink(dir / "gone.ckpt", dir / "b.ckpt");
  const auto files = list_ckpt_files(dir.string());
  REQUIRE(files.size() == 2);
  CHECK_THROWS_WITH(read_ckpt_sample(files[1], {}), Catch::Contains("cannot open (No such file"));
}

TEST_CASE("the tokens-only reader reads the ids and mask records, never the hidden states",
          "[data]") {
  const auto dir = temp_dir("ckpt_tokens");
  const auto path = (dir / "a.ckpt").string();
  // 128 tokens of hidden size 512: 512 KiB of hidden states against 2 KiB of ids and mask.
  write_ckpt(path, make_sample(128, 512, 7));
  const uint64_t size = std::filesystem::file_size(path);
  uint64_t read = 0;
  const TokenSample t = read_ckpt_tokens(path, {}, &read);
  const RawSample whole = read_ckpt_sample(path);
  CHECK(at::equal(t.input_ids, whole.input_ids));
  CHECK(at::equal(t.loss_mask, whole.loss_mask));
  INFO("read " << read << " of " << size << " bytes");
  CHECK(read > 2 * 128 * 8);  // the two int64 records at least
  CHECK(read < size / 50);
  // The token checks are read_ckpt_sample's: a bad mask or an id past the vocabulary fails.
  auto d = make_sample(8, 4, 0);
  d.insert_or_assign("loss_mask", at::full({8}, 3, at::kLong));
  write_ckpt(dir / "bad.ckpt", d);
  CHECK(error_of([&] {
          read_ckpt_tokens((dir / "bad.ckpt").string());
        }).find("loss_mask has values other than 0 and 1") != std::string::npos);
  CHECK(error_of([&] {
          read_ckpt_tokens(path, {12, 0, true});
        }).find(">= vocab_size 12") != std::string::npos);
  CHECK_THROWS_WITH(read_ckpt_tokens((dir / "gone.ckpt").string()),
                    Catch::Contains("cannot open (No such file"));
  // The hidden states are not looked at: a NaN there is the loader's to report.
  d = make_sample(8, 4, 0);
  d.insert_or_assign("hidden_state",
                     at::full({1, 8, 4}, std::numeric_limits<float>::quiet_NaN(), at::kBFloat16));
  write_ckpt(dir / "nan.ckpt", d);
  CHECK(read_ckpt_tokens((dir / "nan.ckpt").string()).input_ids.numel() == 8);
  // A .ckpt dataset's tokens-only reads go through it.
  auto ds = open_feature_dataset(dir.string());
  CHECK(ds->read_tokens_only(0).input_ids.numel() == 128);
}
