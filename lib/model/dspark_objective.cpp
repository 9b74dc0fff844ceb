// DSpark's objective (dspark_objective.h): the operations of SpecForge 0.2.0's
// OnlineDSparkModel objective in its order, over chunks of blocks whose logits are never held
// whole (model/chunk_reduce takes each chunk's gradient as it computes it).
#include "model/dspark_objective.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/block_acceptance.h"
#include "model/chunk_reduce.h"

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

  // The chunks through model/chunk_reduce: the loss's direction is the alphas on the three
  // differentiable terms (term_list's first three, each one element of the flat sum).
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : heads->parameters())
    if (p.requires_grad()) params.push_back(p);
  // The function outlives this call (backward may rerun it): it holds copies, and the accepted
  // counts' destination only until forward is over, so they are appended once.
  auto accepted = std::make_shared<std::vector<at::Tensor>*>(accepted_blocks);
  const at::Tensor lm_head = used.lm_head_weight;
  // chunk_reduce concatenates the terms (promoting their dtypes); each is cast back to its own.
  auto dtypes = std::make_shared<std::vector<at::ScalarType>>();
  const ChunkTermsFn fn = [heads = heads.ptr(), lm_head, alphas, with_target, accepted, dtypes](
                              const std::vector<at::Tensor>& s, const std::vector<at::Tensor>&) {
    DSparkObjectiveInputs part;
    part.lm_head_weight = lm_head;
    part.hidden4d = s[0];
    part.prev_token_ids = s[1];
    part.target_ids = s[2];
    part.eval_mask = s[3];
    part.loss_weights = s[4];
    part.aligned_target_hidden = s[5];
    std::vector<at::Tensor> terms =
        term_list(chunk_terms(*heads, part, alphas, with_target, *accepted));
    if (dtypes->empty())
      for (const auto& t : terms) dtypes->push_back(t.scalar_type());
    return terms;
  };
  const at::Tensor flat =
      chunk_reduce(fn,
                   {used.hidden4d, used.prev_token_ids, used.target_ids, used.eval_mask,
                    used.loss_weights, used.aligned_target_hidden},
                   params, chunk_blocks, 1, {alphas.ce, alphas.l1, alphas.confidence});
  *accepted = nullptr;
  // Back to the terms: the differentiable ones keep their graph, the metrics are detached.
  std::vector<at::Tensor> terms;
  int64_t at = 0;
  for (size_t i = 0; i < std::size(kFields); ++i) {
    const bool per_position = kFields[i] == &DSparkTerms::ce_position_num ||
                              kFields[i] == &DSparkTerms::correct_position_num ||
                              kFields[i] == &DSparkTerms::position_den;
    const int64_t len = per_position ? in.hidden4d.size(2) : 1;
    at::Tensor t = flat.narrow(0, at, len);
    at += len;
    if (!per_position) t = t.reshape({});
    t = t.to((*dtypes)[i]);
    terms.push_back(i < kDifferentiable ? t : t.detach());
  }
  return from_list(terms, with_target);
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
