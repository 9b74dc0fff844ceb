// The logged loss is the trained objective (docs/reference.md §5): for several step decays and
// objectives (soft cross-entropy, another --loss-fn, a mix, SpecForge's LK lambda and alpha, per
// batch and per token), unchunked and chunked, unpacked and packed, the train/loss that report()
// forms equals the mean over samples of the scalar each micro-batch backpropagated (times its
// accumulation), and the sum over steps of the decay-weighted reported ploss_i, within 1e-6
// relative in fp32; with a decay other than 0.8 it differs from SpecForge's fixed 0.8 weighting.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/draft_model.h"
#include "model/ttt_loss.h"
#include "support/adding_comm.h"
#include "support/eagle3_step_metrics.h"
#include "support/random_draft.h"
#include "support/small_draft.h"

using namespace fsdp::model;
using fsdp::testing::AddingComm;
using StepMetrics = fsdp::test::Eagle3StepMetrics;

namespace {

constexpr int64_t kT = 3, kS = 10;

// One micro-batch on a dense target: B rows of kS tokens, or one packed row of `documents`.
struct Micro {
  at::Tensor ids, mask, loss_mask, aux;
  TargetDistribution target;
  std::vector<int64_t> documents;
};

Micro make_micro(const DraftConfig& c, int64_t B, std::vector<int64_t> documents = {}) {
  Micro m;
  m.ids = torch::randint(0, c.vocab_size, {B, kS}, torch::kLong);
  m.mask = torch::ones({B, kS}, torch::kLong);
  m.loss_mask = torch::rand({B, kS}).gt(0.3).to(torch::kLong);
  m.loss_mask.narrow(1, 2, 4).fill_(1);
  m.aux = torch::randn({B, kS, c.fc_in_features()}) * 2;
  m.target.target_p = (torch::randn({B, kS + kT, c.draft_vocab()}) * 2).softmax(-1);
  m.target.position_mask = m.loss_mask * torch::rand({B, kS}).gt(0.2).to(torch::kLong);
  m.target.draft_mass = torch::rand({B, kS}) * 0.5 + 0.5;
  m.documents = std::move(documents);
  return m;
}

struct Objective {
  const char* name;
  const char* loss_fn;  // empty: soft_ce alone
  LossOptions::LK lk;
  LossNormalization normalization;
};

const Objective kObjectives[] = {
    {"soft_ce", "", LossOptions::LK::kNone, LossNormalization::kBatchTokens},
    {"kl_div", "kl_div", LossOptions::LK::kNone, LossNormalization::kBatchTokens},
    {"mix", R"({"kl_div": 0.5, "tv": 0.3, "jsd": 0.2})", LossOptions::LK::kNone,
     LossNormalization::kValidTokens},
    {"LK lambda", "", LossOptions::LK::kLambda, LossNormalization::kBatchTokens},
    {"LK alpha", "", LossOptions::LK::kAlpha, LossNormalization::kValidTokens},
};

double weighted(const std::vector<double>& ploss, double decay) {
  double sum = 0;
  for (size_t i = 0; i < ploss.size(); ++i)
    sum += std::pow(decay, static_cast<double>(i)) * ploss[i];
  return sum;
}

}  // namespace

TEST_CASE("the logged loss is the objective backward ran: decays, objectives, chunked, packed",
          "[train][loss]") {
  DraftConfig c = fsdp::testing::small_draft();
  c.validate();
  torch::manual_seed(21);
  Eagle3Draft model(c);
  fsdp::testing::randomise_draft(model);
  // Two batches of 2 rows and a packed row of two documents (its objective sums theirs).
  const std::vector<Micro> micros = {make_micro(c, 2), make_micro(c, 2), make_micro(c, 1, {4, 6})};
  const int64_t accumulation = 4;  // the backward scalar's divisor
  for (const Objective& objective : kObjectives) {
    for (double decay : {0.8, 1.0, 0.5}) {
      for (int64_t chunk : {int64_t{-1}, int64_t{3}}) {
        INFO(objective.name << ", decay " << decay << ", head chunk " << chunk);
        LossOptions o;
        o.ttt_length = kT;
        o.accumulation_steps = accumulation;
        o.step_decay = decay;
        o.lk = objective.lk;
        o.normalization = objective.normalization;
        o.head_chunk_rows = chunk;
        if (*objective.loss_fn) o.loss_terms = parse_loss_spec(objective.loss_fn);
        StepMetrics metrics(kT);
        double backpropagated = 0;  // sum of each micro-batch's backward scalar x accumulation
        int64_t units = 0;
        for (const Micro& m : micros) {
          model->zero_grad();
          StepOutput out =
              ttt_step(*model, m.target, m.ids, m.mask, m.loss_mask, m.aux, o, m.documents);
          const double scalar = out.loss.item<double>();
          out.loss.backward();
          // The objective is the scalar backward ran, before the accumulation's division.
          CHECK(out.objective.item<double>() ==
                Approx(scalar * static_cast<double>(accumulation)).epsilon(1e-6));
          // ... and the decay-weighted sum of this micro-batch's ploss_i.
          std::vector<double> ploss;
          for (int64_t i = 0; i < kT; ++i) ploss.push_back(out.ploss[i].item<double>());
          CHECK(out.objective.item<double>() == Approx(weighted(ploss, decay)).epsilon(1e-6));
          backpropagated += scalar * static_cast<double>(accumulation);
          units += out.units;
          metrics.add(out);
        }
        CHECK(units == 4);  // the two batches, the packed row's two documents
        AddingComm one_rank;
        const auto reported = metrics.report(one_rank, "train");
        const std::map<std::string, double> r(reported.begin(), reported.end());
        const double loss = r.at("train/loss");
        CHECK(loss == Approx(backpropagated / static_cast<double>(units)).epsilon(1e-6));
        std::vector<double> ploss;
        for (int64_t i = 0; i < kT; ++i) ploss.push_back(r.at("train/ploss_" + std::to_string(i)));
        CHECK(loss == Approx(weighted(ploss, decay)).epsilon(1e-6));
        // The fixed 0.8 weighting this replaced would have logged another number.
        if (decay != 0.8) CHECK(std::abs(loss - weighted(ploss, 0.8)) > 1e-3 * std::abs(loss));
      }
    }
  }
}
