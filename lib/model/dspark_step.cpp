// One DSpark step (model/dspark_step.h).
#include "model/dspark_step.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace fsdp::model {

DSparkStep dspark_step(DSparkDraftImpl& draft, const DSparkStepInputs& in) {
  FSDP_CHECK(in.layout != nullptr, "dspark_step: no block layout",
             "a caller bug: pass the blocks drawn");
  const BlockLayout& layout = *in.layout;
  const int64_t B = in.input_ids.size(0), bs = layout.block_size, N = layout.num_blocks();
  const at::Tensor out = draft.backbone->forward(in.embedded, in.context, layout);

  const DSparkBlockLabels labels =
      dspark_block_labels(in.input_ids, in.loss_mask, layout.anchors, layout.keep, bs);
  DSparkObjectiveInputs obj;
  obj.hidden4d = out.view({B, N, bs, -1});
  obj.prev_token_ids = dspark_prev_token_ids(in.input_ids, layout.anchors, labels.target_ids);
  obj.target_ids = labels.target_ids;
  obj.eval_mask = labels.eval_mask;
  obj.loss_weights = dspark_loss_weights(labels.eval_mask, in.decay_gamma);
  if (in.target_hidden.defined()) {
    obj.aligned_target_hidden =
        dspark_aligned_target_hidden(in.target_hidden, labels.safe_label_indices);
  }
  obj.lm_head_weight = in.lm_head;

  std::vector<std::string> units;
  if (draft.heads->has_markov_head()) units.emplace_back("markov_head");
  if (draft.heads->has_confidence_head()) units.emplace_back("confidence_head");
  UnitHooks* hooks = draft.unit_hooks();
  if (hooks)
    for (const auto& u : units) hooks->pre_forward(u);
  DSparkStep step;
  step.terms = dspark_objective(draft.heads, obj, in.alphas, in.chunk_blocks, in.accepted_blocks);
  step.loss_sum = in.alphas.ce * step.terms.ce_num + in.alphas.l1 * step.terms.l1_num +
                  in.alphas.confidence * step.terms.confidence_num;
  if (hooks)
    for (auto u = units.rbegin(); u != units.rend(); ++u) hooks->post_forward(*u, step.loss_sum);
  step.loss_weights = obj.loss_weights;
  step.labels = labels;
  step.prev_token_ids = obj.prev_token_ids;
  return step;
}

}  // namespace fsdp::model
