// The metrics report() forms from the step sums (docs/reference.md §5), each against a
// brute-force count written out here: pooled and per-batch acc_i, simulated_acc_len (as the
// expectation over every hit/miss pattern), cond_acc_i, acceptance_rate_i and
// acceptance_rate_renorm_i, both acceptance lengths, the loss (the micro-batches' objectives per
// sample); ranks simulated by a communicator that adds another rank's sums; resume sums.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/ttt_loss.h"
#include "support/adding_comm.h"
#include "support/eagle3_step_metrics.h"

using fsdp::config::AccuracyAggregation;
using fsdp::testing::AddingComm;
using StepMetrics = fsdp::test::Eagle3StepMetrics;

namespace {

// One micro-batch's sums for T steps.
struct Micro {
  std::vector<float> correct, tokens, chain_hits, accept_rate, positions;
  float accepted_drafts = 0, drafts = 0, anchors = 0;
};

fsdp::model::StepOutput output(const Micro& m) {
  const auto f = [](const std::vector<float>& v) { return torch::tensor(v, torch::kFloat); };
  const auto s = [](float v) { return torch::scalar_tensor(v, torch::kFloat); };
  fsdp::model::StepOutput o;
  const auto T = static_cast<int64_t>(m.correct.size());
  o.ploss = torch::full({T}, 0.5, torch::kFloat);
  o.correct = f(m.correct);
  o.loss_tokens = f(m.tokens);
  o.position_tokens = f(m.positions);
  o.accept_rate = f(m.accept_rate);
  o.accept_rate_renorm = f(m.accept_rate) * 1.25;  // at least accept_rate, as the real one
  // Unlike any fixed weighting of ploss (0.5 at every step): the loss is the objectives' mean.
  o.objective = torch::scalar_tensor(1.0 + 0.1 * m.drafts, torch::kFloat);
  o.chain_hits = f(m.chain_hits);
  o.accepted = o.chain_hits.sum();
  o.anchors = s(m.anchors);
  o.draft_accepted = s(m.accepted_drafts);
  o.drafts = s(m.drafts);
  o.valid_tokens = torch::scalar_tensor(100, torch::kLong);
  return o;
}

std::map<std::string, double> as_map(const std::vector<std::pair<std::string, double>>& v) {
  return {v.begin(), v.end()};
}

const std::vector<Micro> kMicros = {
    // Unequal lengths: pooled and per-batch acc differ.
    {{1, 1, 0}, {2, 2, 1}, {1, 1, 0}, {1.5, 1.0, 0.25}, {2, 2, 1}, 3, 2, 2},
    {{30, 20, 9}, {100, 90, 80}, {25, 15, 6}, {60, 40, 30}, {95, 85, 75}, 40, 30, 50},
};
const std::vector<Micro> kOtherRank = {
    {{5, 2, 1}, {10, 9, 8}, {4, 2, 1}, {6, 4, 2}, {10, 9, 8}, 8, 5, 6},
};

}  // namespace

TEST_CASE("step metrics: each formula against a brute-force count, pooled over ranks", "[train]") {
  const int64_t T = 3;
  // The other rank's sums, as its global_sums would hand them over.
  StepMetrics other(T);
  for (const Micro& m : kOtherRank) other.add(output(m));
  AddingComm self;
  const std::vector<double> other_sums = other.global_sums(self);

  for (auto aggregation : {AccuracyAggregation::kPooled, AccuracyAggregation::kPerBatch}) {
    INFO("per-batch " << (aggregation == AccuracyAggregation::kPerBatch));
    StepMetrics metrics(T, c10::Device(c10::kCPU), aggregation);
    for (const Micro& m : kMicros) metrics.add(output(m));
    AddingComm two;
    two.others = other_sums;
    int64_t tokens = 0;
    const auto r = as_map(metrics.report(two, "eval", &tokens));
    CHECK(tokens == 300);
    CHECK(metrics.empty());

    std::vector<Micro> all = kMicros;
    all.insert(all.end(), kOtherRank.begin(), kOtherRank.end());
    std::vector<double> acc(T);
    for (int64_t i = 0; i < T; ++i) {
      double correct = 0, tokens_i = 0, batch_mean = 0, rate = 0, positions = 0;
      for (const Micro& m : all) {
        correct += m.correct[i];
        tokens_i += m.tokens[i];
        batch_mean += double{m.correct[i]} / m.tokens[i] / static_cast<double>(all.size());
        rate += m.accept_rate[i];
        positions += m.positions[i];
      }
      acc[i] = aggregation == AccuracyAggregation::kPooled ? correct / tokens_i : batch_mean;
      CHECK(r.at("eval/acc_" + std::to_string(i)) == Approx(acc[i]).epsilon(1e-6));
      CHECK(r.at("eval/acceptance_rate_" + std::to_string(i)) ==
            Approx(rate / positions).epsilon(1e-12));
      CHECK(r.at("eval/acceptance_rate_renorm_" + std::to_string(i)) ==
            Approx(1.25 * rate / positions).epsilon(1e-6));
      // cond_acc_i: of the chains alive before step i (all anchors at i = 0), those alive after.
      double before = 0, after = 0;
      for (const Micro& m : all) {
        before += i == 0 ? m.anchors : m.chain_hits[i - 1];
        after += m.chain_hits[i];
      }
      CHECK(r.at("eval/cond_acc_" + std::to_string(i)) == Approx(after / before).epsilon(1e-12));
    }
    // Pooled: 36 / 112; per batch: (1/2 + 30/100 + 5/10) / 3, on these unequal micro-batches.
    const double want0 = aggregation == AccuracyAggregation::kPooled ? 36.0 / 112.0 : 1.3 / 3.0;
    CHECK(acc[0] == Approx(want0).epsilon(1e-12));
    // simulated_acc_len as an expectation: steps hit independently with probability acc_i; the
    // accepted length is the number of leading hits. Every pattern of hits and misses, counted.
    double expected = 0;
    for (int pattern = 0; pattern < (1 << T); ++pattern) {
      double prob = 1;
      int leading = 0;
      bool alive = true;
      for (int64_t i = 0; i < T; ++i) {
        const bool hit = (pattern >> i) & 1;
        prob *= hit ? acc[i] : 1 - acc[i];
        alive = alive && hit;
        leading += alive;
      }
      expected += prob * leading;
    }
    CHECK(r.at("eval/simulated_acc_len") == Approx(expected).epsilon(1e-9));
    // Both acceptance lengths: 1 + accepted / chains, all micro-batches and ranks together.
    double drafted = 0, drafts = 0, anchored = 0, anchors = 0;
    for (const Micro& m : all) {
      drafted += m.accepted_drafts;
      drafts += m.drafts;
      for (float h : m.chain_hits) anchored += h;
      anchors += m.anchors;
    }
    CHECK(r.at("eval/accept_len") == Approx(1 + drafted / drafts).epsilon(1e-12));
    CHECK(r.at("eval/accept_len_all_anchors") == Approx(1 + anchored / anchors).epsilon(1e-12));
    double objective = 0;
    for (const Micro& m : all) objective += 1.0 + 0.1 * double{m.drafts};
    CHECK(r.at("eval/loss") == Approx(objective / static_cast<double>(all.size())).epsilon(1e-6));
  }
}

TEST_CASE("step metrics: no drafts, no anchors: those metrics are absent", "[train]") {
  StepMetrics metrics(2);
  Micro m{{0, 0}, {1, 0}, {0, 0}, {0, 0}, {1, 0}, 0, 0, 0};
  metrics.add(output(m));
  AddingComm self;
  const auto r = as_map(metrics.report(self, "train"));
  CHECK(r.count("train/accept_len") == 0);
  CHECK(r.count("train/accept_len_all_anchors") == 0);
  CHECK(r.count("train/cond_acc_0") == 0);
  CHECK(r.at("train/acc_1") == 0);  // no tokens: 0 / max(0, 1e-6)
  CHECK(r.at("train/acceptance_rate_1") == 0);
  CHECK(r.at("train/acceptance_rate_renorm_1") == 0);
  CHECK(r.at("train/simulated_acc_len") == 0);
}

TEST_CASE("step metrics: a checkpoint's sums continue the epoch; older layouts are read",
          "[train]") {
  const int64_t T = 3;
  AddingComm self;
  StepMetrics whole(T), first(T), resumed(T);
  for (const Micro& m : kMicros) whole.add(output(m));
  first.add(output(kMicros[0]));
  const std::vector<double> saved = first.global_sums(self);
  CHECK(saved.size() == static_cast<size_t>(9 * T + 8));
  resumed.add_sums(saved);
  resumed.add(output(kMicros[1]));
  const auto want = as_map(whole.report(self, "train_epoch"));
  const auto got = as_map(resumed.report(self, "train_epoch"));
  for (const auto& [k, v] : want) {
    INFO(k);
    CHECK(got.at(k) == Approx(v).epsilon(1e-12));
  }
  // A checkpoint of the 3T + 4 layout (before the later metrics): its acc sums count; the
  // engine's drafts count from the resume on.
  StepMetrics old(T);
  old.add_sums(std::vector<double>(saved.begin(), saved.begin() + 3 * T + 4));
  old.add(output(kMicros[1]));
  const auto o = as_map(old.report(self, "train_epoch"));
  CHECK(o.at("train_epoch/acc_0") == Approx(want.at("train_epoch/acc_0")).epsilon(1e-12));
  CHECK(o.at("train_epoch/accept_len") == Approx(1 + 40.0 / 30.0).epsilon(1e-12));
  // A checkpoint of the 7T + 6 layout (before the logged objective and SpecForge's acceptance
  // rate): its acceptance sums are the renormalised ones and continue; the loss and
  // acceptance_rate_i count from the resume on.
  StepMetrics before(T);
  before.add_sums(std::vector<double>(saved.begin(), saved.begin() + 7 * T + 6));
  before.add(output(kMicros[1]));
  const auto b = as_map(before.report(self, "train_epoch"));
  for (int64_t i = 0; i < T; ++i) {
    const std::string renorm = "train_epoch/acceptance_rate_renorm_" + std::to_string(i);
    CHECK(b.at(renorm) == Approx(want.at(renorm)).epsilon(1e-12));
    CHECK(b.at("train_epoch/acceptance_rate_" + std::to_string(i)) ==
          Approx(double{kMicros[1].accept_rate[i]} / kMicros[1].positions[i]).epsilon(1e-12));
  }
  CHECK(b.at("train_epoch/loss") == Approx(1.0 + 0.1 * 30).epsilon(1e-6));
  // Any other length is ignored.
  StepMetrics odd(T);
  odd.add_sums(std::vector<double>(5, 1.0));
  CHECK(odd.empty());
}
