// safetensors reader/writer: round trips over every dtype, a table of corrupt files each with
// its own message, selective reads from a sharded Hugging Face directory, and the resolution of
// the target's embedding and LM head names (tied, prefixed, missing).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "checkpoint/target_keys.h"
#include "core/error.h"
#include "core/fs_util.h"

namespace fs = std::filesystem;
using namespace fsdp::checkpoint;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("fsdp_st_" + name + "_" + std::to_string(::getpid()));
  fsdp::remove_tree(p.string());
  fs::create_directories(p);
  return p;
}

void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fsdp::UsageError& e) {
    return e.message() + " | " + e.hint();
  }
  return "<no error>";
}

// A target directory holding `names` (tiny tensors) and a config.json made of `config`.
fs::path target_dir(const std::string& name, const std::vector<std::string>& names,
                    const nlohmann::json& config) {
  const auto dir = temp_dir(name);
  NamedTensors ts;
  for (const auto& n : names) ts.emplace_back(n, at::zeros({4, 2}));
  write_safetensors((dir / "model.safetensors").string(), ts);
  if (!config.is_null()) std::ofstream(dir / "config.json") << config.dump();
  return dir;
}

}  // namespace

TEST_CASE("safetensors round trip keeps order, dtypes, values and metadata", "[checkpoint]") {
  const auto dir = temp_dir("rt");
  NamedTensors ts = {
      {"z.f32", at::randn({3, 5})},
      {"a.bf16", at::randn({7}).to(at::kBFloat16)},
      {"m.f16", at::randn({2, 2, 3}).to(at::kHalf)},
      {"i64", at::arange(11, at::kLong)},
      {"mask", at::rand({9}).gt(0.5)},
      {"u8", at::randint(0, 255, {4}, at::kByte)},
      {"empty", at::zeros({0, 4})},
      {"scalar", at::tensor(3.5)},
      {"strided", at::randn({4, 6}).t()},
  };
  const auto path = (dir / "x.safetensors").string();
  const uint64_t bytes = write_safetensors(path, ts, {{"format", "pt"}, {"k", "v"}});
  REQUIRE(bytes == fs::file_size(path));
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename() == "x.safetensors");

  auto f = SafetensorsFile::open(path);
  REQUIRE(f->tensors().size() == ts.size());
  CHECK(f->metadata().at("format") == "pt");
  CHECK(f->metadata().at("k") == "v");
  // File order is the order given; data starts 8-byte aligned.
  CHECK(f->tensors()[0].name == "z.f32");
  CHECK(f->tensors()[0].begin % 8 == 0);
  for (const auto& [name, t] : ts) {
    at::Tensor r = f->read(name);
    CHECK(r.scalar_type() == t.scalar_type());
    CHECK(r.sizes() == t.sizes());
    CHECK(at::equal(r, t.contiguous()));
  }
}

TEST_CASE("safetensors rejects corrupt files with a message naming the problem", "[checkpoint]") {
  const auto dir = temp_dir("bad");
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string name, header, data, expect;
  };
  const std::vector<Case> cases = {
      {"not json", "{nope", "", "not valid JSON"},
      {"array", "[1,2]", "", "not a JSON object"},
      {"short data", "{" + ok_entry + "}", "1234", "truncated"},
      {"bad dtype", R"({"t":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", "12345678",
       "unknown dtype 'F99'"},
      {"size mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678",
       "do not match dtype F32"},
      {"negative dim", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "12345678",
       "negative dimension"},
      {"reversed offsets", R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", "12345678",
       "end before they begin"},
      {"missing field", R"({"t":{"dtype":"F32","shape":[2]}})", "12345678",
       "needs dtype, shape and data_offsets"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       "12345678", "overlap"},
      {"metadata not strings", R"({"__metadata__":{"a":1}})", "", "is not a string"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const auto p = dir / "bad.safetensors";
    write_raw(p, c.header, c.data);
    const std::string msg = error_of([&] { SafetensorsFile::open(p.string()); });
    CHECK(msg.find(c.expect) != std::string::npos);
    CHECK(msg.find(p.string()) != std::string::npos);  // names the file
  }
  // Header length larger than the file, and a file shorter than the length field.
  {
    const auto p = dir / "len.safetensors";
    std::ofstream out(p, std::ios::binary);
    const char len[8] = {0x00, 0x10, 0, 0, 0, 0, 0, 0};
    out.write(len, 8);
    out << "{}";
    out.close();
    CHECK(error_of([&] { SafetensorsFile::open(p.string()); }).find("not plausible") !=
          std::string::npos);
    std::ofstream(p, std::ios::binary | std::ios::trunc) << "abc";
    CHECK(error_of([&] { SafetensorsFile::open(p.string()); }).find("shorter than") !=
          std::string::npos);
  }
  CHECK(error_of([&] { SafetensorsFile::open((dir / "missing").string()); }).find("cannot open") !=
        std::string::npos);
  // Reading a tensor that is absent names the tensor; unsupported dtypes parse but do not load.
  const auto p = dir / "f8.safetensors";
  write_raw(p, R"({"q":{"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]}})", "12345678");
  auto f = SafetensorsFile::open(p.string());
  CHECK(error_of([&] { f->read("nope"); }).find("no tensor named 'nope'") != std::string::npos);
  CHECK(error_of([&] { f->read("q"); }).find("F8_E5M2") != std::string::npos);
}

TEST_CASE("read_model_tensors opens only the shards holding the requested names", "[checkpoint]") {
  const auto dir = temp_dir("model");
  at::Tensor emb = at::randn({10, 4}).to(at::kBFloat16),
             head = at::randn({10, 4}).to(at::kBFloat16);
  write_safetensors((dir / "model-1.safetensors").string(),
                    {{"model.embed_tokens.weight", emb}, {"model.layers.0.w", at::randn({4, 4})}});
  write_safetensors((dir / "model-2.safetensors").string(), {{"lm_head.weight", head}});
  // A third shard that is garbage: never opened because no requested tensor lives there.
  std::ofstream(dir / "model-3.safetensors") << "garbage";
  nlohmann::json idx = {{"metadata", {{"total_size", 0}}},
                        {"weight_map",
                         {{"model.embed_tokens.weight", "model-1.safetensors"},
                          {"model.layers.0.w", "model-1.safetensors"},
                          {"model.layers.1.w", "model-3.safetensors"},
                          {"lm_head.weight", "model-2.safetensors"}}}};
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  auto got = read_model_tensors(dir.string(), {"model.embed_tokens.weight", "lm_head.weight"});
  CHECK(at::equal(got.at("model.embed_tokens.weight"), emb));
  CHECK(at::equal(got.at("lm_head.weight"), head));
  CHECK(model_weight_map(dir.string()).size() == 4);

  const std::string missing =
      error_of([&] { read_model_tensors(dir.string(), {"embed_tokens.weight"}); });
  CHECK(missing.find("no tensor named 'embed_tokens.weight'") != std::string::npos);
  const std::string garbage =
      error_of([&] { read_model_tensors(dir.string(), {"model.layers.1.w"}); });
  CHECK(garbage.find("model-3.safetensors") != std::string::npos);

  // Single-file checkpoint without an index.
  const auto single = temp_dir("single");
  write_safetensors((single / "model.safetensors").string(), {{"lm_head.weight", head}});
  CHECK(at::equal(read_model_tensors(single.string(), {"lm_head.weight"}).at("lm_head.weight"),
                  head));
  CHECK(error_of([&] {
          read_model_tensors(temp_dir("empty").string(), {"x"});
        }).find("neither model.safetensors nor") != std::string::npos);
  // A pickled checkpoint gets the conversion command.
  const auto pickled = temp_dir("pickled");
  std::ofstream(pickled / "pytorch_model.bin") << "x";
  CHECK(error_of([&] {
          read_model_tensors(pickled.string(), {"x"});
        }).find("save_pretrained('" + pickled.string() + "-safetensors')") != std::string::npos);
  CHECK(error_of([&] {
          read_model_tensors(pickled.string() + "/", {"x"});
        }).find("save_pretrained('" + pickled.string() + "-safetensors')") != std::string::npos);
}

TEST_CASE("target embedding and LM head names: tied, prefixed, explicit, missing", "[checkpoint]") {
  const TargetKeyRequest defaults{"model.embed_tokens.weight", "lm_head.weight", true, true};
  const std::vector<std::string> layer{"model.layers.0.mlp.up_proj.weight", "model.norm.weight"};
  const auto with = [&](std::vector<std::string> names) {
    names.insert(names.end(), layer.begin(), layer.end());
    return names;
  };

  // Llama layout: used as given, nothing to note.
  auto k = resolve_target_keys(
      target_dir("plain", with({"model.embed_tokens.weight", "lm_head.weight"}), {}).string(),
      defaults);
  CHECK(k.embedding_key == "model.embed_tokens.weight");
  CHECK(k.lm_head_key == "lm_head.weight");
  CHECK(k.note.empty());

  // Tied (SmolLM2, Qwen3-0.6B, Llama 3.2 1B): no lm_head tensor, config says so.
  const auto tied =
      target_dir("tied", with({"model.embed_tokens.weight"}), {{"tie_word_embeddings", true}});
  k = resolve_target_keys(tied.string(), defaults);
  CHECK(k.lm_head_key == "model.embed_tokens.weight");
  CHECK(k.note.find("tied") != std::string::npos);
  // Under text_config (multimodal configs) too.
  k = resolve_target_keys(target_dir("tied_text", with({"model.embed_tokens.weight"}),
                                     {{"text_config", {{"tie_word_embeddings", true}}}})
                              .string(),
                          defaults);
  CHECK(k.lm_head_key == "model.embed_tokens.weight");

  // No lm_head and the config does not say tied (Llama's default is untied): an error, no guess.
  std::string e = error_of([&] {
    resolve_target_keys(
        target_dir("untied", with({"model.embed_tokens.weight"}), {{"tie_word_embeddings", false}})
            .string(),
        defaults);
  });
  CHECK(e.find("says tie_word_embeddings: false") != std::string::npos);
  CHECK(e.find("--lm-head-key model.embed_tokens.weight") != std::string::npos);
  e = error_of([&] {
    resolve_target_keys(target_dir("noconfig", with({"model.embed_tokens.weight"}), {}).string(),
                        defaults);
  });
  CHECK(e.find("does not say tie_word_embeddings: true") != std::string::npos);

  // Prefixed language model (Llama 4, Qwen2.5-VL style): the one tensor with the same tail.
  k = resolve_target_keys(
      target_dir("prefixed",
                 with({"language_model.model.embed_tokens.weight", "language_model.lm_head.weight",
                       "vision_model.patch_embedding.weight"}),
                 {})
          .string(),
      defaults);
  CHECK(k.embedding_key == "language_model.model.embed_tokens.weight");
  CHECK(k.lm_head_key == "language_model.lm_head.weight");
  CHECK(k.note.find("token embedding 'language_model.model.embed_tokens.weight'") !=
        std::string::npos);
  // Prefixed and tied.
  k = resolve_target_keys(
      target_dir("prefixed_tied", with({"model.language_model.embed_tokens.weight"}),
                 {{"tie_word_embeddings", true}})
          .string(),
      defaults);
  CHECK(k.lm_head_key == "model.language_model.embed_tokens.weight");

  // Two candidates: an error listing both.
  e = error_of([&] {
    resolve_target_keys(
        target_dir("two",
                   with({"a.embed_tokens.weight", "b.embed_tokens.weight", "lm_head.weight"}), {})
            .string(),
        defaults);
  });
  CHECK(e.find("'a.embed_tokens.weight', 'b.embed_tokens.weight'") != std::string::npos);

  // An explicit name the checkpoint lacks is never replaced, even by a tied embedding.
  TargetKeyRequest explicit_head = defaults;
  explicit_head.lm_head_key = "output.weight";
  explicit_head.lm_head_is_default = false;
  e = error_of([&] { resolve_target_keys(tied.string(), explicit_head); });
  CHECK(e.find("no tensor named 'output.weight'") != std::string::npos);
  TargetKeyRequest explicit_emb = defaults;
  explicit_emb.embedding_is_default = false;
  e = error_of([&] {
    resolve_target_keys(
        target_dir("prefixed_only", with({"x.embed_tokens.weight", "lm_head.weight"}), {}).string(),
        explicit_emb);
  });
  CHECK(e.find("no tensor named 'model.embed_tokens.weight'") != std::string::npos);
  CHECK(e.find("'x.embed_tokens.weight'") != std::string::npos);
}
