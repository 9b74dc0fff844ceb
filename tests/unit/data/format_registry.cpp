// The feature-format registry (data/formats.h): every registered format recognises a directory
// laid out the way its producer writes one, no other format of its detection stage claims that
// directory, datasets report their registered name, and the "no feature files" message names
// what every registered format is recognised by (taken from the registry, not a hand list).
#include <catch2/catch.hpp>

#include <map>

#include "data/formats.h"
#include "data/native_format.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;
namespace fs = std::filesystem;

namespace {

// A directory per registered format. The producers' layouts hold only what recognition looks
// at (their readers' own tests read real dumps); .ckpt and native hold real samples.
std::map<std::string, fs::path> sample_dirs(const fs::path& root) {
  std::map<std::string, fs::path> dirs;
  for (int64_t i = 0; i < 2; ++i)
    write_ckpt(root / "ckpt" / "rows_0-2" / fsdp::str("data_", i, ".ckpt"), make_sample(5, 8, i));
  dirs["ckpt"] = root / "ckpt";
  ConvertOptions o;
  o.input = dirs["ckpt"].string();
  o.output = (root / "native").string();
  convert_to_native(o);
  dirs["native"] = root / "native";
  write_bytes(root / "deepspec" / "manifest.json", {'{', '}'});
  write_bytes(root / "deepspec" / "samples.idx", {});
  dirs["deepspec"] = root / "deepspec";
  write_bytes(root / "speculators" / "hs_0.safetensors", {});
  dirs["speculators"] = root / "speculators";
  write_bytes(root / "modelopt" / "conv_0.pt", {});
  dirs["modelopt"] = root / "modelopt";
  return dirs;
}

}  // namespace

TEST_CASE("registry: each format recognises its own sample directory and no rival claims it",
          "[formats]") {
  const auto root = temp_dir("format_registry");
  const auto dirs = sample_dirs(root);
  for (const auto& f : feature_formats()) {
    INFO("format " << f.name);
    REQUIRE(dirs.count(f.name) == 1);  // a new format brings its sample layout here
    const std::string dir = dirs.at(f.name).string();
    CHECK(f.probe(dir));
    CHECK(find_feature_format(f.name) == &f);
    for (const auto& other : feature_formats()) {
      if (&other == &f || other.detection != f.detection) continue;
      INFO("rival " << other.name);
      CHECK_FALSE(other.probe(dir));
    }
  }
  CHECK(find_feature_format("no-such-format") == nullptr);
  for (const char* name : {"ckpt", "native"})
    CHECK(open_feature_dataset(dirs.at(name).string())->format() == name);
  fsdp::remove_tree(root.string());
}

TEST_CASE("registry: the no-features message names every registered format", "[formats]") {
  const auto root = temp_dir("format_registry_empty");
  const std::string message = error_of([&] { open_feature_dataset(root.string()); });
  CHECK(message.find("no feature files found") != std::string::npos);
  CHECK(message == no_features_message(root.string()));
  for (const auto& f : feature_formats()) {
    INFO("format " << f.name);
    CHECK(message.find(f.recognised_by) != std::string::npos);
  }
  fsdp::remove_tree(root.string());
}
