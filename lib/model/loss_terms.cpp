// The per-row objectives of --loss-fn (ttt_loss.h LossTerm, docs/model.md "Loss functions"):
// their names, the spec parser and the values of one term over rows of logits. Pure functions of
// their arguments: no model, no unroll.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/ttt_loss.h"

namespace fsdp::model {

const char* loss_term_name(LossTerm t) {
  switch (t) {
    case LossTerm::kSoftCE:
      return "soft_ce";
    case LossTerm::kKL:
      return "kl_div";
    case LossTerm::kReverseKL:
      return "rkl";
    case LossTerm::kJSD:
      return "jsd";
    case LossTerm::kTV:
      return "tv";
    case LossTerm::kNLA:
      return "nla";
    case LossTerm::kHardCE:
      return "ce";
    case LossTerm::kLKHybrid:
      return "lk_hybrid";
  }
  return "?";
}

std::vector<std::pair<LossTerm, double>> parse_loss_spec(const std::string& spec) {
  static const LossTerm all[] = {LossTerm::kSoftCE, LossTerm::kKL,      LossTerm::kReverseKL,
                                 LossTerm::kJSD,    LossTerm::kTV,      LossTerm::kNLA,
                                 LossTerm::kHardCE, LossTerm::kLKHybrid};
  std::string names;
  for (LossTerm t : all) names += (names.empty() ? "" : ", ") + std::string(loss_term_name(t));
  auto by_name = [&](const std::string& n) -> LossTerm {
    for (LossTerm t : all)
      if (n == loss_term_name(t)) return t;
    FSDP_USAGE_FAIL(fsdp::str("--loss-fn: unknown objective '", n, "'"),
                    fsdp::str("use one of ", names,
                              ", or a JSON object of weights such as "
                              "'{\"kl_div\": 0.5, \"tv\": 0.5}'"));
  };
  std::vector<std::pair<LossTerm, double>> out;
  if (spec.empty() || spec.front() != '{') {
    out.emplace_back(by_name(spec), 1.0);
    return out;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(spec);
  } catch (const std::exception& e) {
    FSDP_USAGE_FAIL(fsdp::str("--loss-fn '", spec, "' is not valid JSON: ", e.what()),
                    "write e.g. '{\"kl_div\": 0.5, \"tv\": 0.5}'");
  }
  double total = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    FSDP_USAGE_CHECK(it.value().is_number() && std::isfinite(it.value().get<double>()) &&
                         it.value().get<double>() >= 0,
                     fsdp::str("--loss-fn: the weight of '", it.key(), "' is ", it.value().dump()),
                     "give each objective a finite weight >= 0");
    out.emplace_back(by_name(it.key()), it.value().get<double>());
    total += out.back().second;
  }
  FSDP_USAGE_CHECK(total > 0, fsdp::str("--loss-fn '", spec, "' gives no objective a weight"),
                   "give at least one objective a positive weight");
  return out;
}

at::Tensor row_loss(LossTerm term, const at::Tensor& z, const at::Tensor& p) {
  const at::Tensor logq = z.log_softmax(-1);
  // log p of a softmax that underflowed to 0 stays finite (p = 0 rows of p log p drop out).
  auto logp = [&] { return p.clamp_min(std::numeric_limits<float>::min()).log(); };
  auto overlap = [&] { return at::minimum(p, logq.exp()).sum(-1); };
  auto kl = [&] { return (at::xlogy(p, p) - p * logq).sum(-1); };
  switch (term) {
    case LossTerm::kSoftCE:
      return -(p * logq).sum(-1);
    case LossTerm::kKL:
      return kl();
    case LossTerm::kReverseKL: {
      const at::Tensor q = logq.exp();
      return (q * (logq - logp())).sum(-1);
    }
    case LossTerm::kJSD: {
      const at::Tensor q = logq.exp();
      const at::Tensor m = (p + q) * 0.5;
      return 0.5 * ((at::xlogy(p, p) - at::xlogy(p, m)).sum(-1) +
                    (at::xlogy(q, q) - at::xlogy(q, m)).sum(-1));
    }
    case LossTerm::kTV:
      return 1.0 - overlap();
    case LossTerm::kNLA:
      return -overlap().clamp_min(1e-5).log();
    case LossTerm::kHardCE:
      return -logq.gather(-1, p.argmax(-1, /*keepdim=*/true)).squeeze(-1);
    case LossTerm::kLKHybrid: {
      const at::Tensor a = overlap();
      const at::Tensor w = (-3.0 * a.detach()).exp();
      return w * kl() + (1.0 - w) * (1.0 - a);
    }
  }
  return at::Tensor();
}

}  // namespace fsdp::model
