// Distributed sampler: 1..4 simulated ranks in one process cover each sample exactly once per
// epoch (up to the dropped tail), never overlap, are deterministic, resume mid-epoch, and match
// Python torch.utils.data.DistributedSampler(drop_last=True) when the venv is available.
#include "data/sampler.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <set>
#include <sstream>

#include "support/test_paths.h"
#include "test_util.h"

using namespace fsdp::data;

TEST_CASE("ranks partition each epoch, drop the tail, and differ across epochs", "[data]") {
  for (int64_t n : {1, 7, 10, 37}) {
    for (int w = 1; w <= 4; ++w) {
      for (int64_t b : {1, 2, 3}) {
        INFO("N=" << n << " W=" << w << " B=" << b);
        std::set<int64_t> seen;
        int64_t batched = 0;
        for (int r = 0; r < w; ++r) {
          DistributedSampler s(n, r, w, b, 42);
          const auto idx = s.epoch_indices(3);
          CHECK(static_cast<int64_t>(idx.size()) == n / w);
          CHECK(s.batches_per_epoch() == (n / w) / b);
          for (int64_t i : idx) {
            CHECK(i >= 0);
            CHECK(i < n);
            CHECK(seen.insert(i).second);  // no sample on two ranks
          }
          for (int64_t k = 0; k < s.batches_per_epoch(); ++k) {
            const auto bi = s.batch_indices(3, k);
            CHECK(static_cast<int64_t>(bi.size()) == b);
            CHECK(std::equal(bi.begin(), bi.end(), idx.begin() + k * b));
            batched += b;
          }
        }
        CHECK(static_cast<int64_t>(seen.size()) == (n / w) * w);  // only the tail is dropped
        CHECK(batched == w * ((n / w) / b) * b);
      }
    }
  }
  DistributedSampler s(100, 1, 3, 2, 7);
  CHECK(s.epoch_indices(0) == DistributedSampler(100, 1, 3, 2, 7).epoch_indices(0));
  CHECK(s.epoch_indices(0) != s.epoch_indices(1));
  CHECK(s.epoch_indices(1) == DistributedSampler(100, 1, 3, 2, 6).epoch_indices(2));  // seed+epoch
  DistributedSampler ordered(10, 1, 2, 1, 7, /*shuffle=*/false);
  CHECK(ordered.epoch_indices(5) == std::vector<int64_t>{1, 3, 5, 7, 9});
}

TEST_CASE("sampler rejects bad arguments with the flag name", "[data]") {
  CHECK_THROWS_WITH(DistributedSampler(10, 0, 1, 0, 0),
                    Catch::Contains("--draft-micro-batch-size"));
  CHECK_THROWS(DistributedSampler(10, 2, 2, 1, 0));
}

TEST_CASE("sampler order equals Python DistributedSampler(drop_last=True)", "[data][python]") {
  using namespace fsdp::data::testing;
  if (!have_python())
    FAIL("no Python at FSDP_PYTHON '" << FSDP_PYTHON << "' (launch/setup.sh configures its venv)");
  const auto dir = temp_dir("sampler_py");
  const auto out = dir / "order.txt";
  std::ostringstream script;
  script << "import torch\n"
         << "from torch.utils.data import DistributedSampler\n"
         << "with open('" << out.string() << "','w') as f:\n"
         << "  for n,w,seed,ep in [(37,3,0,0),(37,3,0,1),(100,4,42,5),(5,2,1,2)]:\n"
         << "    for r in range(w):\n"
         << "      "
            "s=DistributedSampler(range(n),num_replicas=w,rank=r,shuffle=True,seed=seed,drop_last="
            "True)\n"
         << "      s.set_epoch(ep)\n"
         << "      f.write(' '.join(map(str,list(s)))+'\\n')\n";
  std::ofstream(dir / "s.py") << script.str();
  REQUIRE(run_python(dir / "s.py") == 0);
  std::ifstream in(out);
  std::string line;
  struct C {
    int64_t n;
    int w;
    uint64_t seed;
    int64_t ep;
  };
  for (const C c : {C{37, 3, 0, 0}, C{37, 3, 0, 1}, C{100, 4, 42, 5}, C{5, 2, 1, 2}}) {
    for (int r = 0; r < c.w; ++r) {
      REQUIRE(std::getline(in, line));
      std::istringstream is(line);
      std::vector<int64_t> expect;
      for (int64_t x; is >> x;) expect.push_back(x);
      INFO("N=" << c.n << " W=" << c.w << " r=" << r << " seed=" << c.seed << " epoch=" << c.ep);
      CHECK(DistributedSampler(c.n, r, c.w, 1, c.seed).epoch_indices(c.ep) == expect);
    }
  }
}
