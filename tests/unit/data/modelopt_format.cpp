// ModelOpt {conversation_id}.pt dumps written here with torch.save's format (including the
// string and bool keys ModelOpt adds): the tensors read back bit-equal, files in byte-wise name
// order, a missing loss_mask means every token, and missing keys or pre-norm dumps are refused.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <catch2/catch.hpp>

#include "data/formats.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;

namespace {

// torch.save of a dict with any values (data/torch_save.h takes tensors only; ModelOpt's dicts
// also hold conversation_id strings and a bool).
void write_pt(const fs::path& p, const c10::impl::GenericDict& dict) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::vector<char> out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* c = static_cast<const char*>(data);
    out.insert(out.end(), c, c + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  write_bytes(p, out);
}

struct MoSample {
  at::Tensor ids, mask, hidden, aux;  // mask undefined: an older dump without loss_mask
};

MoSample make_mo_sample(int64_t s, int64_t h, int64_t layers, int64_t tag, bool with_mask) {
  MoSample m;
  m.ids = at::arange(s, at::kLong) + tag;
  if (with_mask) {
    m.mask = at::ones({s}, at::kLong);
    m.mask[1] = 0;
  }
  m.hidden = (at::randn({s, h}) + tag).to(at::kBFloat16);
  m.aux = (at::randn({s, layers * h}) - tag).to(at::kBFloat16);
  return m;
}

c10::impl::GenericDict to_dict(const MoSample& m, const std::string& id) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("input_ids", m.ids);
  d.insert("hidden_states", m.hidden);
  d.insert("aux_hidden_states", m.aux);
  d.insert("conversation_id", id);
  if (m.mask.defined()) d.insert("loss_mask", m.mask);
  return d;
}

DatasetOptions opts(int64_t layers) {
  DatasetOptions o;
  o.num_aux_layers = layers;
  return o;
}

}  // namespace

TEST_CASE("modelopt: tensors read back bit-equal, in file-name order, opening reads no file",
          "[modelopt]") {
  const auto dir = temp_dir("modelopt_ok");
  const int64_t h = 64;
  const MoSample a = make_mo_sample(6, h, 3, 1, true);
  const MoSample b = make_mo_sample(9, h, 3, 2, false);
  const MoSample c = make_mo_sample(4, h, 3, 3, true);
  // Written out of order; "B" < "a" byte-wise.
  write_pt(dir / "conv_a.pt", to_dict(a, "conv_a"));
  write_pt(dir / "conv_B.pt", to_dict(b, "conv_B"));
  auto dc = to_dict(c, "conv_c");
  dc.insert("hidden_states_prenorm", false);
  write_pt(dir / "conv_c.pt", dc);
  // ModelOpt's vocab_mapping subdirectory is not features.
  write_pt(dir / "vocab_mapping" / "d2t.pt", to_dict(a, "x"));

  REQUIRE(is_modelopt_dump(dir.string()));
  const auto ds = open_modelopt_dataset(dir.string(), opts(3));
  CHECK(ds->files_opened() == 0);
  CHECK(ds->format() == "modelopt");
  CHECK(ds->root() == dir.string());
  REQUIRE(ds->size() == 3);
  CHECK(ds->source_key(0) == "conv_B.pt");
  CHECK(ds->source_key(1) == "conv_a.pt");
  CHECK(ds->source_key(2) == "conv_c.pt");
  CHECK(ds->source(1) == (dir / "conv_a.pt").string());
  CHECK(ds->source_bytes(1) == fs::file_size(dir / "conv_a.pt"));
  CHECK(ds->captured_layer_ids().empty());
  CHECK_FALSE(ds->hidden_state_prenorm());

  const MoSample* order[3] = {&b, &a, &c};
  for (int64_t i = 0; i < 3; ++i) {
    const MoSample& m = *order[i];
    // No loss_mask in the dump: every token is trained on, as ModelOpt's own loader does.
    const at::Tensor mask = m.mask.defined() ? m.mask : at::ones_like(m.ids);
    const RawSample want = validate_sample(m.ids, mask, m.hidden, m.aux, "reference", {});
    const RawSample got = ds->read(i);
    CHECK(got.source == ds->source(i));
    CHECK(at::equal(got.input_ids, want.input_ids));
    CHECK(at::equal(got.loss_mask, want.loss_mask));
    CHECK(at::equal(got.hidden_state, want.hidden_state));
    CHECK(at::equal(got.aux_hidden_state, want.aux_hidden_state));
  }
  CHECK(ds->files_opened() == 3);
  CHECK(ds->read_tokens(0).loss_mask.sum().item<int64_t>() == 9);

  // Tokens only: the hidden-state records stay on disk (here 1 MiB of the file).
  const auto big_dir = temp_dir("modelopt_tokens");
  const MoSample big = make_mo_sample(128, 512, 3, 4, true);
  write_pt(big_dir / "big.pt", to_dict(big, "big"));
  const auto fresh = open_modelopt_dataset(big_dir.string(), opts(3));
  const TokenSample t = fresh->read_tokens_only(0);
  CHECK(at::equal(t.input_ids, big.ids));
  CHECK(at::equal(t.loss_mask, big.mask));
  const uint64_t size = fs::file_size(big_dir / "big.pt");
  INFO("tokens-only read " << fresh->bytes_read() << " of " << size);
  CHECK(fresh->bytes_read() > 2 * 128 * 8);  // the two int64 records at least
  CHECK(fresh->bytes_read() < size / 50);
  CHECK(fresh->files_opened() == 1);

  // A directory with SpecForge .ckpt files is not a ModelOpt dump.
  write_ckpt(dir / "x.ckpt", make_sample(4, 4, 0));
  CHECK_FALSE(is_modelopt_dump(dir.string()));
  CHECK_FALSE(is_modelopt_dump((dir / "vocab_mapping" / "none").string()));
}

TEST_CASE("modelopt: missing keys, pre-norm dumps and wrong layer counts are bad samples",
          "[modelopt]") {
  const auto dir = temp_dir("modelopt_bad");
  const int64_t h = 8;
  auto no_aux = to_dict(make_mo_sample(5, h, 3, 1, true), "a");
  REQUIRE(no_aux.erase("aux_hidden_states") == 1);
  write_pt(dir / "a_missing.pt", no_aux);
  auto prenorm = to_dict(make_mo_sample(5, h, 3, 1, true), "b");
  prenorm.insert("hidden_states_prenorm", true);
  write_pt(dir / "b_prenorm.pt", prenorm);
  write_pt(dir / "c_five.pt", to_dict(make_mo_sample(5, h, 5, 1, true), "c"));
  write_bytes(dir / "d_junk.pt", std::vector<char>(100, 'x'));

  const auto ds = open_modelopt_dataset(dir.string(), opts(3));
  REQUIRE(ds->size() == 4);
  CHECK_THROWS_AS(ds->read(0), BadSampleError);
  std::string e = error_of([&] { ds->read(0); });
  INFO(e);
  CHECK(e.find("a_missing.pt: missing key 'aux_hidden_states' (keys present: ") !=
        std::string::npos);
  CHECK(e.find("input_ids") != std::string::npos);
  CHECK(e.find("conversation_id") != std::string::npos);
  // The tokens-only reader refuses it too (keys come from the pickle, no storage read).
  CHECK(error_of([&] { ds->read_tokens_only(0); }).find("missing key 'aux_hidden_states'") !=
        std::string::npos);

  CHECK_THROWS_AS(ds->read(1), BadSampleError);
  e = error_of([&] { ds->read(1); });
  INFO(e);
  CHECK(e.find("b_prenorm.pt: hidden_states were dumped before the target's final norm "
               "(hidden_states_prenorm = True), which is not supported") != std::string::npos);
  CHECK(error_of([&] { ds->read_tokens_only(1); }).find("hidden_states_prenorm") !=
        std::string::npos);

  e = error_of([&] { ds->read(2); });
  INFO(e);
  CHECK(e.find("c_five.pt: aux_hidden_state holds 5 captured layers") != std::string::npos);
  CHECK(e.find("the draft reads 3") != std::string::npos);
  CHECK(open_modelopt_dataset(dir.string(), opts(5))->read(2).aux_hidden_state.size(1) == 5 * h);

  e = error_of([&] { ds->read(3); });
  INFO(e);
  CHECK(e.find("d_junk.pt: not a torch.save zip archive") != std::string::npos);

  const auto empty = temp_dir("modelopt_empty");
  CHECK_FALSE(is_modelopt_dump(empty.string()));
  CHECK(error_of([&] { open_modelopt_dataset(empty.string(), {}); }).find("no *.pt files") !=
        std::string::npos);
}
