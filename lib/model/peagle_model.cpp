// The P-EAGLE draft (model/peagle_model.h).
#include "model/peagle_model.h"

#include <ATen/ATen.h>

#include "core/unit_hooks.h"

namespace fsdp::model {

MaskHiddenImpl::MaskHiddenImpl(int64_t width) {
  weight = register_parameter("weight", at::randn({1, 1, width}));
}

PEagleDraftImpl::PEagleDraftImpl(const PEagleConfig& cfg) : Eagle3DraftImpl(cfg.core), pcfg_(cfg) {
  mask_hidden = register_module("mask_hidden", MaskHidden(cfg.core.fc_in_features()));
  set_embedding_trainable(cfg.core.pad_token_id.value_or(-1));
}

std::vector<std::string> PEagleDraftImpl::unit_names() const {
  std::vector<std::string> out = Eagle3DraftImpl::unit_names();
  out.insert(out.begin() + 1, "mask_hidden");  // after embed_tokens, before fc and its norms
  return out;
}

at::Tensor PEagleDraftImpl::project_mask() {
  at::Tensor m = run_unit(unit_hooks(), "mask_hidden", [&] { return mask_hidden->weight.clone(); });
  return project_aux(m);
}

std::string PEagleDraftImpl::export_name(const std::string& name) {
  if (name == "mask_hidden.weight") return "mask_hidden";
  if (name.rfind("midlayer.", 0) == 0) return "layers.0." + name.substr(9);
  return name;
}

}  // namespace fsdp::model
