// Packing on the host (data/packing.h): first-fit-decreasing bin counts, exactly the bins asked
// for (none empty, none over the budget, every sample once, in sampler order inside a bin),
// deterministic; a packed micro-batch's row; a collated micro-batch split back into samples.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "data/packing.h"

using namespace fsdp::data;

namespace {

void check_plan(const std::vector<std::vector<int64_t>>& plan, const std::vector<int64_t>& lengths,
                int64_t budget, int64_t bins) {
  REQUIRE(static_cast<int64_t>(plan.size()) == bins);
  std::multiset<int64_t> seen;
  for (const auto& bin : plan) {
    CHECK(!bin.empty());
    CHECK(std::is_sorted(bin.begin(), bin.end()));
    int64_t load = 0;
    for (int64_t j : bin) {
      load += lengths[static_cast<size_t>(j)];
      seen.insert(j);
    }
    CHECK(load <= budget);
  }
  CHECK(static_cast<int64_t>(seen.size()) == static_cast<int64_t>(lengths.size()));
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == lengths.size());
}

Sample sample(int64_t L, int64_t H, int64_t first_id) {
  Sample s;
  s.input_ids = torch::arange(first_id, first_id + L, torch::kLong);
  s.loss_mask = torch::ones({L}, torch::kLong);
  s.attention_mask = torch::ones({L}, torch::kLong);
  s.aux_hidden = torch::randn({L, 3 * H}).to(torch::kBFloat16);
  s.target_hidden = torch::randn({L, H}).to(torch::kBFloat16);
  return s;
}

}  // namespace

TEST_CASE("packing: first-fit decreasing counts", "[data][packing]") {
  CHECK(count_bins({8, 8, 8}, 8) == 3);
  CHECK(count_bins({5, 3, 4, 4}, 8) == 2);
  CHECK(count_bins({1, 1, 1, 1, 1}, 8) == 1);
  CHECK(count_bins({7, 2, 6, 1}, 8) == 2);
  CHECK_THROWS_AS(count_bins({9}, 8), fsdp::UsageError);
  CHECK_THROWS_AS(count_bins({0}, 8), fsdp::UsageError);
}

TEST_CASE("packing: exactly the bins asked for, within the budget", "[data][packing]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t budget = 16 + static_cast<int64_t>(rng() % 48);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 24);
    std::vector<int64_t> lengths;
    for (int64_t k = 0; k < n; ++k)
      lengths.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(budget)));
    const int64_t least = count_bins(lengths, budget);
    for (int64_t bins = least; bins <= n; ++bins) {
      INFO("trial " << trial << ", " << bins << " bins");
      const auto plan = pack_bins(lengths, budget, bins);
      check_plan(plan, lengths, budget, bins);
      CHECK(plan == pack_bins(lengths, budget, bins));  // deterministic
    }
  }
  // Balanced when it fits: 4 x 4 tokens into 2 bins of 16 go 2 + 2.
  CHECK(pack_bins({4, 4, 4, 4}, 16, 2) == std::vector<std::vector<int64_t>>{{0, 2}, {1, 3}});
  // Least-filled-first leaves no bin for the last 3 here (9 | 9 | 9); first-fit decreasing
  // packs 6+4 | 5+5 | 4+3+3, exactly the 3 bins.
  const std::vector<int64_t> tight{6, 5, 5, 4, 4, 3, 3};
  check_plan(pack_bins(tight, 10, 3), tight, 10, 3);
  CHECK_THROWS_AS(pack_bins({4, 4}, 8, 3), fsdp::Error);
}

TEST_CASE("packing: one row of whole documents, and a padded micro-batch split back",
          "[data][packing]") {
  torch::manual_seed(1);
  const int64_t H = 4;
  std::vector<Sample> docs{sample(3, H, 10), sample(1, H, 20), sample(5, H, 30)};
  const Batch p = collate_packed(docs);
  CHECK(p.documents == std::vector<int64_t>{3, 1, 5});
  REQUIRE(p.input_ids.sizes() == torch::IntArrayRef({1, 9}));
  CHECK(torch::equal(p.input_ids[0], torch::tensor({10, 11, 12, 20, 30, 31, 32, 33, 34})));
  CHECK(torch::equal(p.target_hidden[0].narrow(0, 4, 5), docs[2].target_hidden));
  CHECK(torch::equal(p.aux_hidden[0].narrow(0, 3, 1), docs[1].aux_hidden));
  CHECK(p.attention_mask.sum().item<int64_t>() == 9);

  const Batch padded = collate({docs[2], docs[0], docs[1]});
  const std::vector<Sample> back = split_rows(padded);
  REQUIRE(back.size() == 3);
  CHECK(torch::equal(back[0].input_ids, docs[2].input_ids));
  CHECK(torch::equal(back[1].aux_hidden, docs[0].aux_hidden));
  CHECK(torch::equal(back[2].target_hidden, docs[1].target_hidden));
  // A stand-in for a skipped sample keeps its one all-zero token.
  const Batch with_empty = collate({docs[0], empty_sample(H)});
  const std::vector<Sample> parts = split_rows(with_empty);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].input_ids.size(0) == 1);
  CHECK(parts[1].attention_mask.sum().item<int64_t>() == 0);
}
