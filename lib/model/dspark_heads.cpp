// DSpark's Markov and confidence heads (dspark_heads.h): the operations of SpecForge's
// VanillaMarkovHead, GatedMarkovHead, RNNMarkovHead and AcceptRatePredictor, in their order.
#include "model/dspark_heads.h"

#include <ATen/ATen.h>

#include <vector>

#include "core/error.h"

namespace fsdp::model {
namespace {

namespace nn = torch::nn;

void check_shapes(const at::Tensor& base, const at::Tensor& prev, const at::Tensor& hidden) {
  FSDP_CHECK(base.dim() >= 2 && prev.dim() == base.dim() - 1 && hidden.dim() == base.dim() &&
                 prev.sizes() == base.sizes().slice(0, base.dim() - 1) &&
                 hidden.sizes().slice(0, hidden.dim() - 1) == prev.sizes(),
             fsdp::str("DSpark heads: base logits ", base.sizes(), ", previous tokens ",
                       prev.sizes(), " and hidden states ", hidden.sizes(), " do not agree"),
             "pass [..., bs, V] logits, [..., bs] token ids and [..., bs, H] hidden states");
}

}  // namespace

at::Tensor dspark_float(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
}

MarkovHeadImpl::MarkovHeadImpl(const DSparkHeadsConfig& cfg)
    : type(cfg.markov_head_type), rank(cfg.markov_rank) {
  FSDP_CHECK(rank > 0, fsdp::str("Markov head of rank ", rank),
             "markov_rank must be > 0 for a head");
  markov_w1 = register_module("markov_w1", nn::Embedding(cfg.vocab_size, rank));
  markov_w2 =
      register_module("markov_w2", nn::Linear(nn::LinearOptions(rank, cfg.vocab_size).bias(false)));
  if (type == MarkovHeadType::kGated) {
    gate_proj = register_module("gate_proj", nn::Linear(cfg.hidden_size + rank, rank));
  } else if (type == MarkovHeadType::kRnn) {
    joint_proj = register_module("joint_proj", nn::Linear(2 * rank + cfg.hidden_size, 3 * rank));
  }
}

at::Tensor MarkovHeadImpl::embed(const at::Tensor& token_ids) {
  return markov_w1->forward(token_ids.to(at::kLong));
}

at::Tensor MarkovHeadImpl::apply_block(const at::Tensor& base_logits,
                                       const at::Tensor& prev_token_ids, const at::Tensor& hidden) {
  check_shapes(base_logits, prev_token_ids, hidden);
  if (base_logits.size(-2) == 0) return base_logits;
  if (type == MarkovHeadType::kRnn) return rnn_block(base_logits, prev_token_ids, hidden);
  const at::Tensor prev = embed(prev_token_ids);
  if (type == MarkovHeadType::kVanilla) return base_logits + markov_w2->forward(prev);
  const at::Tensor gate = at::sigmoid(gate_proj->forward(at::cat({hidden, prev}, -1)));
  return base_logits + markov_w2->forward(gate.to(prev.scalar_type()) * prev);
}

at::Tensor MarkovHeadImpl::rnn_block(const at::Tensor& base_logits,
                                     const at::Tensor& prev_token_ids, const at::Tensor& hidden) {
  std::vector<int64_t> state_shape(base_logits.sizes().begin(), base_logits.sizes().end() - 2);
  state_shape.push_back(rank);
  at::Tensor state = at::zeros(state_shape, hidden.options());
  const int64_t bs = base_logits.size(-2);
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(bs));
  for (int64_t k = 0; k < bs; ++k) {
    const at::Tensor prev = embed(prev_token_ids.select(-1, k));
    const at::Tensor z = joint_proj->forward(at::cat({state, prev, hidden.select(-2, k)}, -1));
    const std::vector<at::Tensor> parts = z.chunk(3, -1);
    const at::Tensor gate = at::sigmoid(parts[0]);
    state = gate * state + (1.0 - gate) * at::tanh(parts[1]);
    out.push_back(base_logits.select(-2, k) + markov_w2->forward(at::tanh(parts[2])));
  }
  return at::stack(out, -2);
}

ConfidenceHeadImpl::ConfidenceHeadImpl(int64_t input_dim) {
  proj = register_module("proj", nn::Linear(input_dim, 1));
}

at::Tensor ConfidenceHeadImpl::forward(const at::Tensor& features) {
  return proj->forward(features).squeeze(-1);
}

DSparkHeadsImpl::DSparkHeadsImpl(const DSparkHeadsConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  if (cfg_.has_markov_head()) markov_head = register_module("markov_head", MarkovHead(cfg_));
  if (cfg_.enable_confidence_head) {
    confidence_head =
        register_module("confidence_head", ConfidenceHead(cfg_.confidence_input_dim()));
  }
  reset_parameters(cfg_.initializer_range);
}

void DSparkHeadsImpl::reset_parameters(double std) {
  FSDP_CHECK(std > 0, fsdp::str("initialisation std ", std, " is invalid"),
             "set initializer_range in the draft config to a positive number (0.02)");
  at::NoGradGuard guard;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (bias) {
      p.value().zero_();
    } else {
      p.value().normal_(0.0, std);
    }
  }
}

at::Tensor DSparkHeadsImpl::apply_logits_head(const at::Tensor& base_logits4d,
                                              const at::Tensor& prev_token_ids,
                                              const at::Tensor& hidden4d) {
  if (!has_markov_head()) return base_logits4d;
  FSDP_CHECK(prev_token_ids.defined(), "DSpark's Markov head needs the previous token ids",
             "pass prev_token_ids (dspark_prev_token_ids)");
  return markov_head->apply_block(base_logits4d, prev_token_ids, hidden4d);
}

at::Tensor DSparkHeadsImpl::predict_confidence(const at::Tensor& hidden4d,
                                               const at::Tensor& prev_token_ids) {
  if (!has_confidence_head()) return {};
  at::Tensor features = hidden4d;
  if (cfg_.confidence_head_with_markov) {
    FSDP_CHECK(prev_token_ids.defined(), "DSpark's Markov confidence head needs previous tokens",
               "pass prev_token_ids (dspark_prev_token_ids)");
    const at::Tensor prev = markov_head->embed(prev_token_ids).to(hidden4d.scalar_type());
    features = at::cat({hidden4d, prev}, -1);
  }
  return dspark_float(confidence_head->forward(features));
}

}  // namespace fsdp::model
