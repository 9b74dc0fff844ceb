// DSpark's objective (dspark_objective.h): the operations of SpecForge 0.2.0's
// OnlineDSparkModel objective in its order, over chunks of blocks whose logits are never held
// whole (an autograd function that takes each chunk's gradient as it computes it).
#include "model/dspark_objective.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/error.h"
#include "model/block_acceptance.h"

namespace fsdp::model {
namespace {

// Every term, in the order the chunked autograd function returns them; the differentiable ones
// (ce_num, l1_num, confidence_num) first.
constexpr at::Tensor DSparkTerms::*kFields[] = {
    &DSparkTerms::ce_num,           &DSparkTerms::l1_num,
    &DSparkTerms::confidence_num,   &DSparkTerms::confidence_error_num,
    &DSparkTerms::correct_num,      &DSparkTerms::eval_den,
    &DSparkTerms::ce_position_num,  &DSparkTerms::correct_position_num,
    &DSparkTerms::position_den,     &DSparkTerms::teacher_agreement_num,
    &DSparkTerms::teacher_top1_num, &DSparkTerms::draft_top1_num,
    &DSparkTerms::tau_num,          &DSparkTerms::tau_den};
constexpr size_t kDifferentiable = 3;

std::vector<at::Tensor> term_list(const DSparkTerms& t) {
  std::vector<at::Tensor> out;
  for (auto field : kFields) out.push_back(t.*field);
  return out;
}

DSparkTerms from_list(const std::vector<at::Tensor>& v, bool has_target) {
  FSDP_ASSERT(v.size() == std::size(kFields), "DSpark term count");
  DSparkTerms t;
  for (size_t i = 0; i < v.size(); ++i) t.*kFields[i] = v[i];
  t.has_target = has_target;
  return t;
}

DSparkObjectiveInputs narrow_blocks(const DSparkObjectiveInputs& in, int64_t from, int64_t len) {
  auto cut = [&](const at::Tensor& x) { return x.defined() ? x.narrow(1, from, len) : x; };
  return {cut(in.hidden4d),  cut(in.prev_token_ids), cut(in.target_ids),
          cut(in.eval_mask), cut(in.loss_weights),   cut(in.aligned_target_hidden),
          in.lm_head_weight};
}

// The target side of one chunk, without a graph: its probabilities and argmax.
struct TargetSide {
  at::Tensor probabilities, ids;
};

TargetSide target_side(const at::Tensor& aligned, const at::Tensor& weight,
                       at::IntArrayRef logits_shape) {
  at::NoGradGuard guard;
  const int64_t B = aligned.size(0), rows = aligned.size(1) * aligned.size(2);
  const at::Tensor logits =
      at::linear(aligned.reshape({B, rows, aligned.size(3)}), weight).reshape(logits_shape);
  return {at::softmax(dspark_float(logits), -1), logits.argmax(-1)};
}

// The metrics of one chunk (no graph), given its draft logits and per-position values; appends
// the chunk's accepted counts to `accepted_blocks` when given. The engine drafts greedily from
// the anchor's token, each proposal's Markov bias read from the token it proposed before; while
// every earlier proposal is its label, that token is the label the teacher-forced logits here
// read, so the leading run of right argmaxes from position 0 is what the engine accepts.
void chunk_metrics(DSparkTerms& t, const DSparkObjectiveInputs& in, const at::Tensor& draft,
                   const at::Tensor& ce, const at::Tensor& draft_p, const TargetSide& target,
                   const at::Tensor& accept, std::vector<at::Tensor>* accepted_blocks) {
  at::NoGradGuard guard;
  const at::Tensor& eval = in.eval_mask;
  const at::Tensor predicted = draft.argmax(-1);
  const at::Tensor correct = dspark_float(at::logical_and(predicted == in.target_ids, eval));
  if (accepted_blocks) {
    accepted_blocks->push_back(accepted_prefix(predicted, in.target_ids, eval, /*first=*/0));
  }
  t.correct_num = correct.sum();
  t.eval_den = dspark_float(eval).sum();
  t.ce_position_num = (ce.detach() * eval).sum(at::IntArrayRef{0, 1});
  t.correct_position_num = correct.sum(at::IntArrayRef{0, 1});
  t.position_den = dspark_float(eval).sum(at::IntArrayRef{0, 1});
  if (!t.has_target) return;
  t.teacher_agreement_num = (dspark_float(predicted == target.ids) * eval).sum();
  t.teacher_top1_num = (std::get<0>(target.probabilities.max(-1)) * eval).sum();
  t.draft_top1_num = (std::get<0>(draft_p.max(-1)) * eval).sum();
  const at::Tensor valid_blocks = dspark_float(eval.any(-1));
  const at::Tensor expected = (accept.detach() * eval).cumprod(-1).sum(-1) + 1.0;
  t.tau_num = (expected * valid_blocks).sum();
  t.tau_den = valid_blocks.sum();
}

// Every term of one chunk of blocks, with a graph when grad mode is on (chunk_metrics appends to
// `accepted_blocks` when given).
DSparkTerms chunk_terms(DSparkHeadsImpl& heads, const DSparkObjectiveInputs& in,
                        const DSparkAlphas& alphas, bool with_target,
                        std::vector<at::Tensor>* accepted_blocks) {
  const at::Tensor& hidden = in.hidden4d;
  const int64_t B = hidden.size(0), N = hidden.size(1), bs = hidden.size(2), H = hidden.size(3);
  const at::Tensor base =
      at::linear(hidden.reshape({B, N * bs, H}), in.lm_head_weight).reshape({B, N, bs, -1});
  const at::Tensor draft = heads.apply_logits_head(base, in.prev_token_ids, hidden);
  const int64_t V = draft.size(-1);
  const at::Tensor ce = at::cross_entropy_loss(draft.reshape({-1, V}), in.target_ids.reshape(-1),
                                               {}, at::Reduction::None)
                            .reshape_as(in.target_ids);
  DSparkTerms t;
  t.has_target = with_target;
  t.ce_num = (ce * in.loss_weights).sum();
  auto zero = [&] { return at::zeros({}, t.ce_num.options()); };
  t.l1_num = zero();
  t.confidence_num = zero();
  t.confidence_error_num = zero();
  t.teacher_agreement_num = zero();
  t.teacher_top1_num = zero();
  t.draft_top1_num = zero();
  t.tau_num = zero();
  t.tau_den = zero();
  TargetSide target;
  at::Tensor draft_p, accept;
  if (with_target) {
    target = target_side(in.aligned_target_hidden, in.lm_head_weight, draft.sizes());
    draft_p = at::softmax(dspark_float(draft), -1);
    const at::Tensor l1 = (draft_p - target.probabilities).abs().sum(-1);
    accept = (1.0 - 0.5 * l1).clamp(0.0, 1.0);
    if (alphas.l1 > 0) t.l1_num = (l1 * in.loss_weights).sum();
  }
  if (heads.has_confidence_head() && alphas.confidence > 0) {
    FSDP_ASSERT(accept.defined(), "a confidence loss without the target");
    const at::Tensor logit = dspark_float(heads.predict_confidence(hidden, in.prev_token_ids));
    const at::Tensor bce =
        at::binary_cross_entropy_with_logits(logit, accept.detach(), {}, {}, at::Reduction::None);
    t.confidence_num = (bce * in.loss_weights).sum();
    t.confidence_error_num = ((at::sigmoid(logit) - accept).abs() * in.loss_weights).sum().detach();
  }
  chunk_metrics(t, in, draft, ce, draft_p, target, accept, accepted_blocks);
  return t;
}

std::vector<at::Tensor> add_lists(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] + b[i];
  return a;
}

int64_t chunk_count(int64_t n, int64_t chunk) {
  return (n + chunk - 1) / chunk;
}

// What the chunked objective needs besides hidden4d and the parameters; held by the autograd
// node until backward. The heads module is held, not its weights: a chunk run again in backward
// reads the live parameters (gathered again by a sharding engine), as chunked_head.cpp's HeadCall
// does.
struct ObjectiveCall : torch::CustomClassHolder {
  std::shared_ptr<DSparkHeadsImpl> heads;
  DSparkObjectiveInputs in;  // hidden4d undefined here: the node saves it
  std::vector<at::Tensor> params;
  DSparkAlphas alphas;
  bool with_target = false;
  int64_t chunk = 1;
  // The caller's, read by forward only (backward reruns the chunks) and cleared after it.
  std::vector<at::Tensor>* accepted_blocks = nullptr;

  DSparkObjectiveInputs blocks(const at::Tensor& hidden, int64_t from, int64_t len) const {
    DSparkObjectiveInputs all = in;
    all.hidden4d = hidden;
    return narrow_blocks(all, from, len);
  }
  // The weights dspark_loss gives the differentiable terms (ce_num, l1_num, confidence_num).
  double weight(size_t i) const {
    return i == 0 ? alphas.ce : i == 1 ? alphas.l1 : alphas.confidence;
  }
};

// The gradients of sum_i seed_i * term_i over the chunks run so far: grad_h [B, N, bs, H] (when
// hidden4d wants one), each parameter's in fp32 (fp64 for double), rounded once at the end.
struct ChunkGradients {
  at::Tensor hidden;
  std::vector<at::Tensor> params;

  ChunkGradients(const ObjectiveCall& call, const at::Tensor& h, bool want_h,
                 const std::vector<bool>& want_p) {
    if (want_h) hidden = at::zeros_like(h);
    params.resize(call.params.size());
    for (size_t j = 0; j < params.size(); ++j) {
      if (!want_p[j]) continue;
      const at::Tensor& p = call.params[j];
      params[j] = at::zeros(p.sizes(), p.options().dtype(dspark_float(p).scalar_type()));
    }
  }
};

// Runs blocks [from, from + len) with a graph, adds the gradient of sum_i seeds[i] * term_i (the
// differentiable terms; an undefined seed leaves its term out) into `g`, and returns the chunk's
// terms detached. `has_graph`, when given, receives which differentiable terms had a graph.
std::vector<at::Tensor> chunk_with_gradient(const ObjectiveCall& call, const at::Tensor& hidden,
                                            int64_t from, int64_t len,
                                            const std::vector<at::Tensor>& seeds, ChunkGradients& g,
                                            std::vector<at::Tensor>* accepted_blocks,
                                            std::vector<bool>* has_graph) {
  at::Tensor leaf = hidden.narrow(1, from, len).detach();
  std::vector<at::Tensor> wrt;
  if (g.hidden.defined()) wrt.push_back(leaf.requires_grad_(true));
  for (size_t j = 0; j < g.params.size(); ++j)
    if (g.params[j].defined()) wrt.push_back(call.params[j]);
  std::vector<at::Tensor> terms, outputs, used_seeds;
  {
    at::AutoGradMode enable(true);
    DSparkObjectiveInputs blocks = call.blocks(hidden, from, len);
    blocks.hidden4d = leaf;
    terms =
        term_list(chunk_terms(*call.heads, blocks, call.alphas, call.with_target, accepted_blocks));
    for (size_t i = 0; i < kDifferentiable; ++i) {
      if (has_graph) (*has_graph)[i] = (*has_graph)[i] || terms[i].requires_grad();
      if (!terms[i].requires_grad() || !seeds[i].defined()) continue;
      outputs.push_back(terms[i]);
      used_seeds.push_back(seeds[i].to(terms[i].options()));
    }
  }
  if (!outputs.empty() && !wrt.empty()) {
    const torch::autograd::variable_list d =
        torch::autograd::grad(outputs, wrt, used_seeds, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    size_t k = 0;
    if (g.hidden.defined()) {
      const at::Tensor& gh = d[k++];
      if (gh.defined()) g.hidden.narrow(1, from, len).copy_(gh);
    }
    for (auto& gp : g.params) {
      if (!gp.defined()) continue;
      const at::Tensor& part = d[k++];
      if (part.defined()) gp.add_(part);
    }
  }
  for (auto& t : terms) t = t.detach();
  return terms;
}

// c with seeds[i] = c * weight(i) for every differentiable term that had a graph (within float
// rounding), or nothing: what backward needs to reuse the gradients forward took.
std::optional<double> seed_scale(const ObjectiveCall& call, const std::vector<at::Tensor>& seeds,
                                 const std::vector<bool>& has_graph) {
  std::vector<double> s(kDifferentiable, 0.0);
  size_t ref = kDifferentiable;
  for (size_t i = 0; i < kDifferentiable; ++i) {
    if (!has_graph[i]) continue;
    if (seeds[i].defined()) s[i] = seeds[i].item<double>();
    if (call.weight(i) != 0 && (ref == kDifferentiable || call.weight(i) > call.weight(ref)))
      ref = i;
  }
  if (ref == kDifferentiable) return std::nullopt;
  const double c = s[ref] / call.weight(ref);
  for (size_t i = 0; i < kDifferentiable; ++i) {
    if (!has_graph[i]) continue;
    const double expect = c * call.weight(i);
    if (std::abs(s[i] - expect) > 1e-6 * std::max(std::abs(s[i]), std::abs(expect)))
      return std::nullopt;
  }
  return c;
}

// Inputs: hidden4d, then the heads' parameters (so autograd routes their gradients to each
// parameter's AccumulateGrad once per backward). Outputs: the 14 terms of term_list; the first
// three differentiable. Forward runs each chunk with a graph and takes at once the gradient of
// the loss's own combination, weight(i) * term_i (SpecForge's alphas): the trainer's loss is
// that combination times one factor, so backward only scales the gradients kept (hidden4d's and
// the heads'), and no chunk's logits are ever formed twice. Seeds in another proportion (a
// caller that differentiates one term alone) rerun each chunk in backward with them.
struct ChunkedObjective : torch::autograd::Function<ChunkedObjective> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                const c10::intrusive_ptr<ObjectiveCall>& call) {
    const at::Tensor& hidden = inputs[0];
    std::vector<bool> want_p;
    for (const at::Tensor& p : call->params) want_p.push_back(p.requires_grad());
    ChunkGradients g(*call, hidden, hidden.requires_grad(), want_p);
    std::vector<at::Tensor> seeds(kDifferentiable);
    for (size_t i = 0; i < kDifferentiable; ++i)
      if (call->weight(i) != 0) seeds[i] = at::scalar_tensor(call->weight(i), at::kDouble);
    std::vector<bool> has_graph(kDifferentiable, false);
    const int64_t n = hidden.size(1);
    std::vector<at::Tensor> totals;
    for (int64_t c = 0; c < chunk_count(n, call->chunk); ++c) {
      const int64_t from = c * call->chunk, len = std::min(call->chunk, n - from);
      auto terms = chunk_with_gradient(*call, hidden, from, len, seeds, g, call->accepted_blocks,
                                       &has_graph);
      totals = totals.empty() ? std::move(terms) : add_lists(std::move(totals), terms);
    }
    call->accepted_blocks = nullptr;
    ctx->save_for_backward({hidden});
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->saved_data["grad_hidden"] = g.hidden;
    ctx->saved_data["grad_params"] = c10::IValue(c10::List<std::optional<at::Tensor>>(
        std::vector<std::optional<at::Tensor>>(g.params.begin(), g.params.end())));
    ctx->saved_data["has_graph"] =
        c10::IValue(std::vector<int64_t>(has_graph.begin(), has_graph.end()));
    ctx->mark_non_differentiable(
        std::vector<at::Tensor>(totals.begin() + kDifferentiable, totals.end()));
    return totals;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call =
        c10::static_intrusive_pointer_cast<ObjectiveCall>(ctx->saved_data["call"].toCapsule());
    const at::Tensor hidden = ctx->get_saved_variables()[0];
    const std::vector<int64_t> graph_list = ctx->saved_data["has_graph"].toIntVector();
    const std::vector<bool> has_graph(graph_list.begin(), graph_list.end());
    std::vector<at::Tensor> seeds(grads.begin(), grads.begin() + kDifferentiable);
    std::vector<bool> want_p;
    for (size_t j = 0; j < call->params.size(); ++j) want_p.push_back(ctx->needs_input_grad(1 + j));
    ChunkGradients g(*call, hidden, false, std::vector<bool>(want_p.size(), false));
    if (const std::optional<double> c = seed_scale(*call, seeds, has_graph)) {
      // The gradients forward took, times the factor the loss applied.
      const at::Tensor kept_h = ctx->saved_data["grad_hidden"].toTensor();
      if (ctx->needs_input_grad(0) && kept_h.defined()) g.hidden = kept_h * *c;
      const auto kept_p = ctx->saved_data["grad_params"].toList();
      for (size_t j = 0; j < g.params.size(); ++j) {
        const c10::IValue v = kept_p.get(j);
        if (want_p[j] && v.isTensor()) g.params[j] = v.toTensor() * *c;
      }
    } else {
      g = ChunkGradients(*call, hidden, ctx->needs_input_grad(0), want_p);
      const int64_t n = hidden.size(1);
      for (int64_t c = 0; c < chunk_count(n, call->chunk); ++c) {
        const int64_t from = c * call->chunk, len = std::min(call->chunk, n - from);
        chunk_with_gradient(*call, hidden, from, len, seeds, g, nullptr, nullptr);
      }
    }
    torch::autograd::variable_list result(1 + g.params.size() + 1);  // + the call argument
    result[0] = g.hidden;
    for (size_t j = 0; j < g.params.size(); ++j)
      if (g.params[j].defined()) result[1 + j] = g.params[j].to(call->params[j].scalar_type());
    return result;
  }
};

void check_inputs(const DSparkHeadsImpl& heads, const DSparkObjectiveInputs& in, bool target) {
  const at::Tensor& h = in.hidden4d;
  FSDP_CHECK(h.defined() && h.dim() == 4 && h.size(1) > 0,
             "DSpark objective: hidden4d must be [B, N, bs, H] with N > 0 blocks",
             "reshape the backbone's output to [B, blocks, block_size, H]");
  const auto blocks = h.sizes().slice(0, 3);
  for (const at::Tensor* t : {&in.prev_token_ids, &in.target_ids, &in.eval_mask, &in.loss_weights})
    FSDP_CHECK(t->defined() && t->sizes() == blocks,
               fsdp::str("DSpark objective: a per-position input is not ", blocks),
               "build labels, masks and weights from the same anchors as hidden4d");
  FSDP_CHECK(in.eval_mask.scalar_type() == at::kBool, "DSpark objective: eval_mask must be bool",
             "pass dspark_block_labels' eval_mask");
  FSDP_CHECK(in.lm_head_weight.defined() && in.lm_head_weight.dim() == 2 &&
                 in.lm_head_weight.size(1) == h.size(3),
             fsdp::str("DSpark objective: lm_head weight must be [V, ", h.size(3), "]"),
             "pass the target's LM head weight");
  FSDP_CHECK(!heads.has_markov_head() || in.lm_head_weight.size(0) == heads.config().vocab_size,
             fsdp::str("DSpark objective: the LM head has ", in.lm_head_weight.size(0),
                       " rows but the Markov head ", heads.config().vocab_size),
             "the draft config's vocab_size must be the target's");
  if (!target) return;
  FSDP_USAGE_CHECK(in.aligned_target_hidden.defined(),
                   "DSpark's L1 and confidence losses need the target's last hidden states",
                   "give features with target_last_hidden_states, or set dspark_l1_loss_alpha "
                   "to 0 and use no confidence head");
  FSDP_CHECK(in.aligned_target_hidden.sizes() == h.sizes(),
             fsdp::str("DSpark objective: the aligned target states are ",
                       in.aligned_target_hidden.sizes(), ", hidden4d ", h.sizes()),
             "gather them with dspark_aligned_target_hidden from the same labels");
}

}  // namespace

DSparkBlockLabels dspark_block_labels(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                                      const at::Tensor& anchors, const at::Tensor& keep_mask,
                                      int64_t block_size) {
  FSDP_CHECK(block_size >= 1 && input_ids.dim() == 2 && loss_mask.sizes() == input_ids.sizes() &&
                 anchors.dim() == 2 && keep_mask.sizes() == anchors.sizes() &&
                 anchors.size(0) == input_ids.size(0),
             fsdp::str("DSpark labels: input_ids ", input_ids.sizes(), ", loss_mask ",
                       loss_mask.sizes(), ", anchors ", anchors.sizes(), ", keep_mask ",
                       keep_mask.sizes(), ", block size ", block_size),
             "pass [B, S] ids and mask and [B, N] anchors and keep mask");
  const int64_t S = input_ids.size(1), N = anchors.size(1);
  const at::Tensor offsets = at::arange(1, block_size + 1, anchors.options().dtype(at::kLong));
  const at::Tensor label = anchors.to(at::kLong).unsqueeze(-1) + offsets.view({1, 1, -1});
  const at::Tensor keep = keep_mask.to(at::kBool).unsqueeze(-1);
  const at::Tensor safe = at::where(keep, label.clamp_max(S - 1), at::zeros_like(label));
  DSparkBlockLabels out;
  out.target_ids = at::gather(input_ids.unsqueeze(1).expand({-1, N, -1}), 2, safe);
  const at::Tensor supervised = at::gather(loss_mask.unsqueeze(1).expand({-1, N, -1}), 2, safe);
  const at::Tensor eval = at::logical_and(at::logical_and(label<S, supervised> 0.5), keep);
  out.eval_mask = eval.to(at::kInt).cumprod(-1).to(at::kBool);
  out.safe_label_indices = safe;
  return out;
}

at::Tensor dspark_prev_token_ids(const at::Tensor& input_ids, const at::Tensor& anchors,
                                 const at::Tensor& target_ids) {
  const at::Tensor anchor_tokens = at::gather(input_ids, 1, anchors.to(at::kLong));
  return at::cat({anchor_tokens.unsqueeze(-1), target_ids.narrow(-1, 0, target_ids.size(-1) - 1)},
                 -1);
}

at::Tensor dspark_loss_weights(const at::Tensor& eval_mask, std::optional<double> gamma) {
  at::Tensor w = eval_mask.to(at::kFloat);
  if (gamma && *gamma > 0) {
    const at::Tensor k = at::arange(eval_mask.size(-1), w.options());
    w = w * at::exp(-k.view({1, 1, -1}) / *gamma);
  }
  return w;
}

at::Tensor dspark_aligned_target_hidden(const at::Tensor& target_last_hidden,
                                        const at::Tensor& safe_label_indices) {
  FSDP_CHECK(target_last_hidden.dim() == 3 && safe_label_indices.dim() == 3 &&
                 target_last_hidden.size(0) == safe_label_indices.size(0),
             fsdp::str("DSpark: target_last_hidden_states ", target_last_hidden.sizes(),
                       " against labels ", safe_label_indices.sizes()),
             "pass [B, S, H] target states of the same batch");
  const int64_t B = target_last_hidden.size(0), H = target_last_hidden.size(2);
  const at::Tensor at_pred = (safe_label_indices - 1).clamp_min(0);
  const at::Tensor index = at_pred.reshape({B, -1, 1}).expand({-1, -1, H});
  std::vector<int64_t> shape(safe_label_indices.sizes().begin(), safe_label_indices.sizes().end());
  shape.push_back(H);
  return at::gather(target_last_hidden, 1, index).reshape(shape);
}

void DSparkAlphas::validate() const {
  const std::pair<const char*, double> all[] = {
      {"training.dspark_ce_loss_alpha", ce},
      {"training.dspark_l1_loss_alpha", l1},
      {"training.dspark_confidence_head_alpha", confidence}};
  for (const auto& [key, value] : all) {
    FSDP_USAGE_CHECK(std::isfinite(value) && value >= 0,
                     fsdp::str(key, " must be >= 0, got ", value),
                     "give a non-negative weight (SpecForge's defaults: 0.1, 0.9, 1.0)");
  }
}

bool dspark_needs_target(const DSparkHeads& heads, const DSparkAlphas& alphas) {
  return alphas.l1 > 0 || (alphas.confidence > 0 && heads->has_confidence_head());
}

DSparkTerms dspark_objective(DSparkHeads& heads, const DSparkObjectiveInputs& in,
                             const DSparkAlphas& alphas, int64_t chunk_blocks,
                             std::vector<at::Tensor>* accepted_blocks) {
  alphas.validate();
  FSDP_USAGE_CHECK(chunk_blocks >= 0, fsdp::str("objective chunk of ", chunk_blocks, " blocks"),
                   "give training.objective_chunk_blocks >= 0 (0: every block at once)");
  const bool with_target = dspark_needs_target(heads, alphas);
  check_inputs(*heads, in, with_target);
  DSparkObjectiveInputs used = in;
  if (!with_target) used.aligned_target_hidden = at::Tensor();
  const int64_t n = in.hidden4d.size(1);
  if (chunk_blocks == 0 || chunk_blocks >= n)
    return chunk_terms(*heads, used, alphas, with_target, accepted_blocks);

  auto call = c10::make_intrusive<ObjectiveCall>();
  call->heads = heads.ptr();
  call->alphas = alphas;
  call->with_target = with_target;
  call->chunk = chunk_blocks;
  call->accepted_blocks = accepted_blocks;
  for (const at::Tensor& p : heads->parameters())
    if (p.requires_grad()) call->params.push_back(p);
  std::vector<at::Tensor> inputs{in.hidden4d};
  inputs.insert(inputs.end(), call->params.begin(), call->params.end());
  const bool graph = at::GradMode::is_enabled() &&
                     std::any_of(inputs.begin(), inputs.end(),
                                 [](const at::Tensor& t) { return t.requires_grad(); });
  if (graph) {
    call->in = used;
    call->in.hidden4d = at::Tensor();
    return from_list(ChunkedObjective::apply(at::TensorList(inputs), call), with_target);
  }
  std::vector<at::Tensor> totals;
  for (int64_t c = 0; c < chunk_count(n, chunk_blocks); ++c) {
    const int64_t from = c * chunk_blocks, len = std::min(chunk_blocks, n - from);
    auto terms = term_list(
        chunk_terms(*heads, narrow_blocks(used, from, len), alphas, with_target, accepted_blocks));
    totals = totals.empty() ? std::move(terms) : add_lists(std::move(totals), terms);
  }
  return from_list(totals, with_target);
}

at::Tensor dspark_loss(const DSparkTerms& terms, const DSparkAlphas& alphas,
                       const at::Tensor& loss_den, double scale) {
  FSDP_USAGE_CHECK(loss_den.defined() && loss_den.item<double>() > 0,
                   "the DSpark objective has no supervised target token in the batch",
                   "check the loss masks: each sample needs two consecutive supervised tokens");
  const at::Tensor sum = alphas.ce * terms.ce_num + alphas.l1 * terms.l1_num +
                         alphas.confidence * terms.confidence_num;
  return scale * sum / loss_den;
}

}  // namespace fsdp::model
