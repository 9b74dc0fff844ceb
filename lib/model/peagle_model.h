// The P-EAGLE draft (docs/model.md "P-EAGLE"): SpecForge 0.2.0's PEagleDraftModel as fsdp-train
// builds it. The decoder is the EAGLE3 draft's (model/draft_model.h: fc, an EAGLE3 first layer
// over [embedding, hidden], plain Llama layers after it, norm, lm_head over the draft
// vocabulary, d2t/t2d); P-EAGLE adds mask_hidden, the learned stand-in for the target's captured
// layers that depths >= 1 read (through fc, as the target's layers are), and trains the
// embedding (the pad token's row gets no gradient).
//
// One step drafts depths 0 .. K-1 at once: the row (anchor a, depth d) sits at position a + d;
// depth 0 reads the token after a and the target's layers at a, depths >= 1 the mask token and
// mask_hidden; a row attends to the depth-0 rows of anchors <= a and to the rows (a, 1..d). That
// is the TTT unroll's attention pattern (step d at position a + d sees step 0 causally and steps
// 1..d on the diagonal), so depth d runs as decode step d of the EAGLE3 draft over every anchor;
// the rows a step does not keep are never read by a kept one (a kept (a, d) has (a, d-1) kept).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/draft_model.h"
#include "model/peagle_config.h"

namespace fsdp::model {

// mask_hidden as a unit of its own (its tensor is mask_hidden.weight here, "mask_hidden" in
// SpecForge's state dict and in exports): [1, 1, n * Ht], drawn from N(0, 1) as SpecForge's.
class MaskHiddenImpl : public torch::nn::Module {
 public:
  explicit MaskHiddenImpl(int64_t width);
  at::Tensor weight;
};
TORCH_MODULE(MaskHidden);

class PEagleDraftImpl : public Eagle3DraftImpl {
 public:
  // The core's EAGLE3 draft, mask_hidden registered after it, the embedding trainable with the
  // config's pad_token_id as its padding row.
  explicit PEagleDraftImpl(const PEagleConfig& cfg);

  const PEagleConfig& peagle_config() const { return pcfg_; }
  // The units in forward order: the EAGLE3 draft's with mask_hidden before fc.
  std::vector<std::string> unit_names() const;
  // fc(mask_hidden) [1, 1, H], inside the mask_hidden and fc units (fc's norms first, if any).
  at::Tensor project_mask();
  // Export names (SpecForge's and vLLM's): mask_hidden.weight -> mask_hidden, midlayer.* ->
  // layers.0.*; the rest as the state dict has them.
  static std::string export_name(const std::string& name);

  MaskHidden mask_hidden{nullptr};

 private:
  PEagleConfig pcfg_;
};
TORCH_MODULE(PEagleDraft);

}  // namespace fsdp::model
