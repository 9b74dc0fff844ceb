// Toy data -> .ckpt -> native shards: every tensor equal after conversion, resume skips
// verified shards and redoes damaged ones, and the toy features really carry the chain.
#include "data/native_format.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "data/toy_data.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;

namespace {
ToyDataOptions small_toy(const fs::path& dir) {
  ToyDataOptions o;
  o.out_dir = dir.string();
  o.num_samples = 20;
  o.min_len = 8;
  o.max_len = 24;
  o.hidden_size = 32;
  o.vocab_size = 64;
  o.draft_vocab_size = 32;
  o.samples_per_dir = 8;
  o.seed = 3;
  return o;
}
}  // namespace

TEST_CASE("toy data: layout, target checkpoint, and hidden states that predict the next token",
          "[data]") {
  const auto dir = temp_dir("toy");
  const auto paths = generate_toy_data(small_toy(dir));
  const auto files = list_ckpt_files(paths.hidden_states_dir);
  REQUIRE(files.size() == 20);
  CHECK(fs::exists(dir / "hidden_states" / "rows_0-8" / "data_0.ckpt"));
  CHECK(fs::exists(dir / "hidden_states" / "rows_16-24" / "data_19.ckpt"));
  const auto head = fsdp::checkpoint::read_model_tensors(
      paths.target_model_dir, {"model.embed_tokens.weight", "lm_head.weight"});
  CHECK(head.at("lm_head.weight").sizes() == at::IntArrayRef({64, 32}));
  CHECK(head.at("model.embed_tokens.weight").scalar_type() == at::kBFloat16);
  const auto cfg = nlohmann::json::parse(std::ifstream(paths.draft_config));
  CHECK(cfg["architectures"][0] == "LlamaForCausalLMEagle3");
  CHECK(cfg["draft_vocab_size"] == 32);
  CHECK(cfg["hidden_size"] == 32);

  // argmax(lm_head . hidden_state[t]) is the token at t+1 far more often than chance (1/64).
  const at::Tensor w = head.at("lm_head.weight").to(at::kFloat);
  int64_t hit = 0, total = 0;
  for (const auto& f : files) {
    const RawSample s = read_ckpt_sample(f);
    const at::Tensor pred = at::matmul(s.hidden_state.to(at::kFloat), w.t()).argmax(1);
    const int64_t n = s.length() - 1;
    hit += pred.narrow(0, 0, n).eq(s.input_ids.narrow(0, 1, n)).sum().item<int64_t>();
    total += n;
  }
  const double acc = static_cast<double>(hit) / static_cast<double>(total);
  INFO("target next-token accuracy " << acc);
  CHECK(acc > 0.3);
  // Same seed, same bytes.
  const auto again = temp_dir("toy2");
  generate_toy_data(small_toy(again));
  CHECK(
      at::equal(read_ckpt_sample(files[7]).aux_hidden_state,
                read_ckpt_sample((again / fs::relative(files[7], dir)).string()).aux_hidden_state));
}

TEST_CASE("convert: native shards hold exactly the .ckpt tensors; resume skips verified shards",
          "[data]") {
  const auto dir = temp_dir("convert");
  const auto paths = generate_toy_data(small_toy(dir));
  ConvertOptions o;
  o.input = paths.hidden_states_dir;
  o.output = (dir / "native").string();
  o.shard_bytes = 20 << 10;  // several shards
  const auto rep = convert_to_native(o);
  CHECK(rep.shards_total > 2);
  CHECK(rep.shards_written == rep.shards_total);
  CHECK(rep.samples_written == 20);
  REQUIRE(is_native_dataset(o.output));

  auto ckpt = open_feature_dataset(paths.hidden_states_dir);
  auto native = open_feature_dataset(o.output);
  CHECK(ckpt->format() == "ckpt");
  CHECK(native->format() == "native");
  REQUIRE(native->size() == ckpt->size());
  for (int64_t i = 0; i < ckpt->size(); ++i) {
    const RawSample a = ckpt->read(i), b = native->read(i);
    CHECK(at::equal(a.input_ids, b.input_ids));
    CHECK(at::equal(a.loss_mask, b.loss_mask));
    CHECK(at::equal(a.hidden_state, b.hidden_state));
    CHECK(at::equal(a.aux_hidden_state, b.aux_hidden_state));
    const TokenSample t = native->read_tokens(i);
    CHECK(at::equal(t.input_ids, a.input_ids));
  }
  CHECK(native->source(3).find("shard_") != std::string::npos);

  // Resume: nothing to do; then damage one shard and drop another's marker: both redone.
  const auto again = convert_to_native(o);
  CHECK(again.shards_written == 0);
  CHECK(again.shards_skipped == rep.shards_total);
  fs::resize_file(fs::path(o.output) / "shard_00001.safetensors", 100);
  fs::remove(fs::path(o.output) / "shard_00002.done");
  const auto third = convert_to_native(o);
  CHECK(third.shards_written == 2);
  auto native2 = open_feature_dataset(o.output);
  for (int64_t i = 0; i < ckpt->size(); ++i)
    CHECK(at::equal(ckpt->read(i).hidden_state, native2->read(i).hidden_state));

  // A damaged shard after conversion is reported by the reader with the shard's name.
  fs::resize_file(fs::path(o.output) / "shard_00000.safetensors", 64);
  auto damaged = open_native_dataset(o.output);
  CHECK_THROWS_AS(damaged->read(0), BadSampleError);
  CHECK(error_of([&] { damaged->read(0); }).find("shard_00000.safetensors") != std::string::npos);
}

TEST_CASE("native read_rows reads only the asked rows, equal to the whole sample's", "[data]") {
  const auto dir = temp_dir("read_rows");
  const auto paths = generate_toy_data(small_toy(dir));
  ConvertOptions o;
  o.input = paths.hidden_states_dir;
  o.output = (dir / "native").string();
  convert_to_native(o);
  auto native = open_feature_dataset(o.output);
  REQUIRE(native->reads_rows());  // convert scanned every row for NaN/Inf
  CHECK_FALSE(open_feature_dataset(paths.hidden_states_dir)->reads_rows());
  for (int64_t i = 0; i < native->size(); ++i) {
    const RawSample whole = native->read(i);
    const int64_t s = whole.length();
    for (const auto& [from, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {0, s}, {3, 5}, {s - 1, 4}, {s, 2}, {s + 3, 1}}) {
      CAPTURE(i, s, from, count);
      uint64_t before = native->bytes_read();
      native->read_tokens(i);
      const uint64_t token_bytes = native->bytes_read() - before;
      before = native->bytes_read();
      const RawSample part = native->read_rows(i, from, count);
      const int64_t begin = std::min(from, s), end = std::min(from + count, s);
      CHECK(part.row_offset == begin);
      CHECK(at::equal(part.input_ids, whole.input_ids));
      CHECK(at::equal(part.loss_mask, whole.loss_mask));
      CHECK(at::equal(part.hidden_state, whole.hidden_state.narrow(0, begin, end - begin)));
      CHECK(at::equal(part.aux_hidden_state, whole.aux_hidden_state.narrow(0, begin, end - begin)));
      // Bytes: the tokens whole, only the asked rows of the hidden states.
      CHECK(native->bytes_read() - before ==
            token_bytes + static_cast<uint64_t>(
                              (end - begin) * 2 *
                              (whole.hidden_state.size(1) + whole.aux_hidden_state.size(1))));
    }
  }
  // An index written without the scan (or before it was recorded) reads whole samples.
  ConvertOptions unchecked = o;
  unchecked.output = (dir / "unchecked").string();
  unchecked.dataset.check_finite = false;
  convert_to_native(unchecked);
  CHECK_FALSE(open_feature_dataset(unchecked.output)->reads_rows());
  DatasetOptions lenient;
  lenient.check_finite = false;
  CHECK(open_feature_dataset(unchecked.output, lenient)->reads_rows());
  // A checked conversion over the unchecked shards redoes them (they were never scanned).
  unchecked.dataset.check_finite = true;
  CHECK(convert_to_native(unchecked).shards_written > 0);
  CHECK(open_feature_dataset(unchecked.output)->reads_rows());
}

TEST_CASE("convert --skip-bad-samples keeps numbering and marks bad samples in the index",
          "[data]") {
  const auto dir = temp_dir("convert_bad");
  for (int i = 0; i < 6; ++i)
    write_ckpt(dir / "in" / ("d" + std::to_string(i) + ".ckpt"), make_sample(5, 4, i));
  std::ofstream(dir / "in" / "d3.ckpt", std::ios::trunc) << "corrupt";
  ConvertOptions o;
  o.input = (dir / "in").string();
  o.output = (dir / "out").string();
  CHECK_THROWS_AS(convert_to_native(o), BadSampleError);
  o.skip_bad_samples = true;
  const auto rep = convert_to_native(o);
  CHECK(rep.bad_samples == 1);
  auto ds = open_feature_dataset(o.output);
  REQUIRE(ds->size() == 6);
  CHECK(at::equal(ds->read(4).input_ids, make_sample(5, 4, 4).at("input_ids")));
  CHECK(error_of([&] { ds->read(3); }).find("marked bad by convert") != std::string::npos);
  ConvertOptions same = o;
  same.output = o.input;
  CHECK_THROWS_WITH(convert_to_native(same), Catch::Contains("must differ"));
}

TEST_CASE("convert without the finite check carries NaN through (byte-exact verification)",
          "[data]") {
  const auto dir = temp_dir("convert_nan");
  auto nan_sample = make_sample(5, 4, 0);
  nan_sample.insert_or_assign("hidden_state",
                              at::full({1, 5, 4}, std::nan(""), at::kFloat).to(at::kBFloat16));
  write_ckpt(dir / "in" / "d0.ckpt", nan_sample);
  write_ckpt(dir / "in" / "d1.ckpt", make_sample(5, 4, 1));
  ConvertOptions o;
  o.input = (dir / "in").string();
  o.output = (dir / "out").string();
  o.dataset.check_finite = false;
  const auto rep = convert_to_native(o);
  CHECK(rep.samples_written == 2);
  DatasetOptions lenient;
  lenient.check_finite = false;
  auto ds = open_feature_dataset(o.output, lenient);
  CHECK(at::isnan(ds->read(0).hidden_state).all().item<bool>());
}

namespace {
// A block-draft .ckpt (SpecForge's DFlash/DSpark keys) of make_sample's tensors; `last`: with
// target_last_hidden_states.
c10::Dict<std::string, at::Tensor> block_sample(int64_t s, int64_t h, int64_t tag, bool last) {
  const auto e = make_sample(s, h, tag);
  c10::Dict<std::string, at::Tensor> d;
  d.insert("input_ids", e.at("input_ids"));
  d.insert("loss_mask", e.at("loss_mask"));
  d.insert("hidden_states", e.at("aux_hidden_state"));
  if (last) d.insert("target_last_hidden_states", e.at("hidden_state"));
  return d;
}
DatasetOptions block_options(DatasetOptions::LastHidden last) {
  DatasetOptions o;
  o.hidden_size = 4;
  o.hidden_key = "target_last_hidden_states";
  o.aux_key = "hidden_states";
  o.last_hidden = last;
  return o;
}
}  // namespace

TEST_CASE(
    "convert: block-draft .ckpt keys are told from the first file; an absent last state "
    "stays absent, an error naming the key only where the draft reads it",
    "[data]") {
  using LastHidden = DatasetOptions::LastHidden;
  const auto dir = temp_dir("convert_block");
  for (int i = 0; i < 4; ++i)
    write_ckpt(dir / "in" / ("d" + std::to_string(i) + ".ckpt"), block_sample(5, 4, i, i != 2));
  CHECK(read_ckpt_key_names((dir / "in" / "d0.ckpt").string()) ==
        std::vector<std::string>{"input_ids", "loss_mask", "hidden_states",
                                 "target_last_hidden_states"});
  for (const char* dtype : {"bf16", "fp8_e4m3"}) {
    ConvertOptions o;
    o.input = (dir / "in").string();
    o.output = (dir / dtype).string();
    o.dtype = dtype;
    o.dataset.num_aux_layers = 0;
    const auto rep = convert_to_native(o);
    CHECK(rep.input_keys == "block");
    CHECK(rep.samples_written == 4);
    CHECK(convert_to_native(o).shards_skipped == rep.shards_total);  // resume: complete
    const auto required = open_feature_dataset(o.output, block_options(LastHidden::kRequired));
    const auto optional = open_feature_dataset(o.output, block_options(LastHidden::kOptional));
    const auto unused = open_feature_dataset(o.output, block_options(LastHidden::kUnused));
    const std::string e = error_of([&] { required->read(2); });
    CHECK(e.find("target_last_hidden_states") != std::string::npos);
    CHECK(e.find("d2.ckpt") != std::string::npos);
    CHECK(!optional->read(2).hidden_state.defined());
    CHECK(optional->read(1).hidden_state.defined());
    CHECK(!unused->read(1).hidden_state.defined());
    if (std::string(dtype) == "bf16") {
      const auto in = block_sample(5, 4, 1, true);
      CHECK(at::equal(required->read(1).hidden_state, in.at("target_last_hidden_states")[0]));
      CHECK(at::equal(unused->read(1).aux_hidden_state, in.at("hidden_states")[0]));
    }
  }
  // The .ckpt reader: the last state never read when unused, a named error when required.
  const std::string d2 = (dir / "in" / "d2.ckpt").string();
  CHECK(error_of([&] {
          read_ckpt_sample(d2, block_options(LastHidden::kRequired));
        }).find("missing key 'target_last_hidden_states'") != std::string::npos);
  CHECK(!read_ckpt_sample((dir / "in" / "d1.ckpt").string(), block_options(LastHidden::kUnused))
             .hidden_state.defined());

  // Without a last state in the first file the hidden size must be given.
  write_ckpt(dir / "nolast" / "d0.ckpt", block_sample(5, 4, 0, false));
  ConvertOptions n;
  n.input = (dir / "nolast").string();
  n.output = (dir / "nolast_out").string();
  n.dataset.num_aux_layers = 0;
  CHECK(error_of([&] { convert_to_native(n); }).find("hidden size cannot be told") !=
        std::string::npos);
  n.dataset.hidden_size = 4;
  CHECK(convert_to_native(n).samples_written == 1);

  // A file with both key sets: convert asks; --ckpt-keys settles it; other formats refuse it.
  auto both = make_sample(5, 4, 0);
  both.insert("hidden_states", both.at("aux_hidden_state"));
  write_ckpt(dir / "both" / "d0.ckpt", both);
  ConvertOptions b;
  b.input = (dir / "both").string();
  b.output = (dir / "both_out").string();
  CHECK(error_of([&] { convert_to_native(b); }).find("cannot tell which to keep") !=
        std::string::npos);
  b.ckpt_keys = "eagle3";
  CHECK(convert_to_native(b).input_keys == "eagle3");
  ConvertOptions native = b;
  native.input = b.output;
  native.output = (dir / "again").string();
  CHECK(error_of([&] { convert_to_native(native); }).find("names its tensors itself") !=
        std::string::npos);
}
