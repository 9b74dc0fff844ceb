// The DSpark draft (docs/block-drafts.md "DSpark"): the DFlash backbone (model/dflash_model.h)
// and DSpark's heads (model/dspark_heads.h) in one module whose parameter names are SpecForge
// 0.2.0's DSparkDraftModel state dict: the backbone's (layers.*, fc, hidden_norm, norm) and the
// heads' (markov_head.*, confidence_head.*) at the top level, as the engines read them. Its units
// (unit_names()) are the backbone's, then markov_head and confidence_head when the config has
// them. Knows nothing about the objective or distribution.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "core/unit_hooks.h"
#include "model/dflash_model.h"
#include "model/dspark_heads.h"

namespace fsdp::model {

class DSparkDraftImpl : public torch::nn::Module {
 public:
  DSparkDraftImpl(const DFlashConfig& backbone, const DSparkHeadsConfig& heads);

  std::vector<std::string> unit_names() const;
  void set_unit_hooks(fsdp::UnitHooks* hooks);
  fsdp::UnitHooks* unit_hooks() const { return hooks_; }
  // Hugging Face's post_init over both parts (the backbone's Linear weights N(0, std), biases
  // zero, norms one; then the heads' weights N(0, std), biases zero).
  void normal_init(double std);

  // The backbone: its children are this module's children too (one set of parameters).
  DFlashDraft backbone{nullptr};
  // The heads, registered here by their own names (markov_head, confidence_head).
  DSparkHeads heads{nullptr};

 private:
  fsdp::UnitHooks* hooks_ = nullptr;
};
TORCH_MODULE(DSparkDraft);

}  // namespace fsdp::model
