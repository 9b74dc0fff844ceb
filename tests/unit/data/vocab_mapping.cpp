// Vocabulary mapping (docs/reference.md §2): a hand-computed example, the fewer-than-Vd case, ties,
// counting over unshifted loss-masked tokens, the cache, and SpecForge file interop.
#include "data/vocab_mapping.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <sstream>

#include "support/test_paths.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {
std::vector<int64_t> vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}
}  // namespace

TEST_CASE("hand-computed mapping: top Vd by count, sorted, d2t offsets, t2d mask", "[data]") {
  // counts over ids 0..9: id 7 (5x), 2 (4x), 9 (3x), 4 (1x) -> top 3 = {7, 2, 9} -> used [2, 7, 9].
  at::Tensor counts = at::tensor(std::vector<int64_t>{0, 0, 4, 0, 1, 0, 0, 5, 0, 3});
  const VocabMapping m = mapping_from_counts(counts, 3);
  CHECK(vec(m.used_ids()) == std::vector<int64_t>{2, 7, 9});
  CHECK(vec(m.d2t) == std::vector<int64_t>{2, 6, 7});
  CHECK(vec(m.t2d) == std::vector<int64_t>{0, 0, 1, 0, 0, 0, 0, 1, 0, 1});
  CHECK(m.d2t.scalar_type() == at::kLong);
  CHECK(m.t2d.scalar_type() == at::kBool);
  // Kept occurrences 5 + 4 + 3 of 13: the draft can never propose id 4.
  CHECK(mapping_coverage(counts, m) == Approx(100.0 * 12 / 13));
  CHECK(mapping_coverage(at::zeros({10}, at::kLong), m) == 100.0);
}

TEST_CASE("fewer distinct ids than Vd: fill with the smallest unused ids", "[data]") {
  at::Tensor counts = at::zeros({8}, at::kLong);
  counts[5] = 3;
  counts[6] = 1;
  CHECK(vec(mapping_from_counts(counts, 4).used_ids()) == std::vector<int64_t>{0, 1, 5, 6});
  CHECK(vec(mapping_from_counts(at::zeros({8}, at::kLong), 3).used_ids()) ==
        std::vector<int64_t>{0, 1, 2});
  CHECK(vec(mapping_from_counts(counts, 8).d2t) == std::vector<int64_t>(8, 0));
}

TEST_CASE("ties are broken by the smaller id", "[data]") {
  at::Tensor counts = at::tensor(std::vector<int64_t>{1, 2, 2, 2, 0, 2});
  CHECK(vec(mapping_from_counts(counts, 2).used_ids()) == std::vector<int64_t>{1, 2});
  CHECK(vec(mapping_from_counts(counts, 4).used_ids()) == std::vector<int64_t>{1, 2, 3, 5});
  CHECK_THROWS_WITH(mapping_from_counts(counts, 7), Catch::Contains("draft_vocab_size 7"));
}

TEST_CASE("counting reads unshifted input_ids at loss_mask == 1, truncated to max_length",
          "[data]") {
  const auto dir = temp_dir("vocab_count");
  auto write = [&](const std::string& name, std::vector<int64_t> ids, std::vector<int64_t> mask) {
    c10::Dict<std::string, at::Tensor> d;
    const int64_t s = static_cast<int64_t>(ids.size());
    d.insert("input_ids", at::tensor(ids));
    d.insert("loss_mask", at::tensor(mask));
    d.insert("hidden_state", at::zeros({1, s, 2}, at::kBFloat16));
    d.insert("aux_hidden_state", at::zeros({1, s, 6}, at::kBFloat16));
    write_ckpt(dir / name, d);
  };
  write("a.ckpt", {3, 4, 5, 6}, {0, 1, 1, 0});
  write("b.ckpt", {4, 4, 7, 1}, {1, 1, 0, 1});
  auto ds = open_feature_dataset(dir.string());
  CHECK(vec(count_loss_tokens(*ds, 8, 100, nullptr)) ==
        std::vector<int64_t>{0, 1, 0, 0, 3, 1, 0, 0});
  // max_length 2: a counts [3,4] at mask [0,1] -> 4; b counts [4,4] -> 4,4.
  CHECK(vec(count_loss_tokens(*ds, 8, 2, nullptr)) == std::vector<int64_t>{0, 0, 0, 0, 3, 0, 0, 0});
  CHECK_THROWS_WITH(count_loss_tokens(*ds, 4, 100, nullptr),
                    Catch::Contains("token id 5 >= vocab_size 4"));

  // build_vocab_mapping caches by key; a cached file is reused (we overwrite it to prove it).
  const auto cache = temp_dir("vocab_cache");
  VocabMappingOptions o{"", cache.string(), 8, 2, 100};
  const VocabMapping m = build_vocab_mapping(*ds, o);
  CHECK(vec(m.used_ids()) == std::vector<int64_t>{1, 4});  // 4 (3x), then tie 1 vs 5 -> 1
  const auto file =
      cache / "vocab_mapping" / vocab_cache_file(dir.string(), 100, 8, 2, dataset_fingerprint(*ds));
  REQUIRE(std::filesystem::exists(file));
  save_vocab_mapping(
      file.string(),
      mapping_from_counts(at::tensor(std::vector<int64_t>{0, 0, 0, 9, 0, 0, 0, 9}), 2));
  CHECK(vec(build_vocab_mapping(*ds, o).used_ids()) == std::vector<int64_t>{3, 7});
  // Other keys miss the cache.
  CHECK(vocab_cache_file(dir.string(), 50, 8, 2) != vocab_cache_file(dir.string(), 100, 8, 2));
  CHECK(vocab_cache_file(dir.string(), 100, 9, 2) != vocab_cache_file(dir.string(), 100, 8, 2));
  CHECK(vocab_cache_file(dir.string(), 100, 8, 3) != vocab_cache_file(dir.string(), 100, 8, 2));
  CHECK(vocab_cache_file(cache.string(), 100, 8, 2) != vocab_cache_file(dir.string(), 100, 8, 2));
  // A cache file that cannot be read is computed again (and rewritten), with a warning.
  {
    std::ofstream cut(file, std::ios::binary | std::ios::trunc);
    cut << "PK\x03\x04 cut short";
  }
  CHECK(vec(build_vocab_mapping(*ds, o).used_ids()) == std::vector<int64_t>{1, 4});
  CHECK(vec(load_vocab_mapping(file.string(), 8, 2).used_ids()) == std::vector<int64_t>{1, 4});
  // Data regenerated in the same directory (another file size or time) gets another key.
  const std::string before = dataset_fingerprint(*ds);
  write("b.ckpt", {4, 4, 7, 1, 7}, {1, 1, 1, 1, 1});
  auto regenerated = open_feature_dataset(dir.string());
  CHECK(dataset_fingerprint(*regenerated) != before);
  CHECK(vec(build_vocab_mapping(*regenerated, o).used_ids()) == std::vector<int64_t>{4, 7});
  o.max_length = 2;
  CHECK(vec(build_vocab_mapping(*ds, o).used_ids()) == std::vector<int64_t>{0, 4});
}

TEST_CASE("the vocab cache key holds both vocabulary sizes and the data fingerprint", "[data]") {
  // A cached mapping of another target vocabulary (V), draft vocabulary (Vd) or of data changed
  // in place (the fingerprint) must never be taken: each gives another cache file.
  const std::string base = vocab_cache_file("/data/x", 2048, 32000, 8000, "00000000000000aa");
  CHECK(vocab_cache_file("/data/x", 2048, 32000, 8000, "00000000000000aa") == base);
  CHECK(vocab_cache_file("/data/x", 2048, 32001, 8000, "00000000000000aa") != base);  // V
  CHECK(vocab_cache_file("/data/x", 2048, 32000, 8001, "00000000000000aa") != base);  // Vd
  CHECK(vocab_cache_file("/data/x", 2048, 32000, 8000, "00000000000000ab") != base);  // data
  CHECK(vocab_cache_file("/data/x", 2048, 32000, 8000) != base);  // no fingerprint
  // Swapping the two sizes is another key too.
  CHECK(vocab_cache_file("/data/x", 2048, 8000, 32000, "00000000000000aa") != base);
}

TEST_CASE("mapping files: round trip, validation, and Python/SpecForge interop", "[data][python]") {
  const auto dir = temp_dir("vocab_file");
  const VocabMapping m = mapping_from_counts(at::tensor(std::vector<int64_t>{5, 0, 2, 0, 7, 1}), 3);
  save_vocab_mapping((dir / "m.pt").string(), m);
  const VocabMapping r = load_vocab_mapping((dir / "m.pt").string(), 6, 3);
  CHECK(at::equal(r.d2t, m.d2t));
  CHECK(at::equal(r.t2d, m.t2d));
  CHECK(error_of([&] {
          load_vocab_mapping((dir / "m.pt").string(), 6, 4);
        }).find("d2t has shape") != std::string::npos);
  CHECK(error_of([&] {
          load_vocab_mapping((dir / "m.pt").string(), 7, 3);
        }).find("t2d has shape") != std::string::npos);
  VocabMapping broken = m;
  broken.t2d = m.t2d.clone();
  broken.t2d[1] = true;
  broken.t2d[0] = false;
  save_vocab_mapping((dir / "broken.pt").string(), broken);
  CHECK(error_of([&] {
          load_vocab_mapping((dir / "broken.pt").string(), 6, 3);
        }).find("disagree") != std::string::npos);
  CHECK(error_of([&] {
          load_vocab_mapping((dir / "none.pt").string(), 6, 3);
        }).find("cannot open") != std::string::npos);

  if (!have_python())
    FAIL("no Python at FSDP_PYTHON '" << FSDP_PYTHON << "' (launch/setup.sh configures its venv)");
  // Python reads ours; SpecForge's way of writing (torch.save of a dict) is read by us.
  std::ostringstream script;
  script << "import torch\n"
         << "m = torch.load('" << (dir / "m.pt").string() << "')\n"
         << "assert m['d2t'].dtype == torch.int64 and m['d2t'].tolist() == [0, 1, 2], m\n"
         << "assert m['t2d'].dtype == torch.bool and m['t2d'].tolist() == [True, False, True, "
            "False, True, False]\n"
         << "used = torch.tensor([1, 3, 4, 8])\n"
         << "d2t = used - torch.arange(4)\n"
         << "t2d = torch.zeros(10, dtype=torch.bool); t2d[used] = True\n"
         << "torch.save({'d2t': d2t, 't2d': t2d}, '" << (dir / "specforge.pt").string() << "')\n";
  std::ofstream(dir / "v.py") << script.str();
  REQUIRE(run_python(dir / "v.py") == 0);
  const VocabMapping sf = load_vocab_mapping((dir / "specforge.pt").string(), 10, 4);
  CHECK(vec(sf.used_ids()) == std::vector<int64_t>{1, 3, 4, 8});
}
