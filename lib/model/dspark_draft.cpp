// The DSpark draft module (model/dspark_draft.h).
#include "model/dspark_draft.h"

namespace fsdp::model {

DSparkDraftImpl::DSparkDraftImpl(const DFlashConfig& backbone_cfg,
                                 const DSparkHeadsConfig& heads_cfg)
    : backbone(backbone_cfg), heads(heads_cfg) {
  // The backbone's children, in its own order, then the heads': the state dict's names.
  for (const auto& child : backbone->named_children()) register_module(child.key(), child.value());
  for (const auto& child : heads->named_children()) register_module(child.key(), child.value());
}

std::vector<std::string> DSparkDraftImpl::unit_names() const {
  std::vector<std::string> out = backbone->unit_names();
  if (heads->has_markov_head()) out.emplace_back("markov_head");
  if (heads->has_confidence_head()) out.emplace_back("confidence_head");
  return out;
}

void DSparkDraftImpl::set_unit_hooks(fsdp::UnitHooks* hooks) {
  hooks_ = hooks;
  backbone->set_unit_hooks(hooks);
}

void DSparkDraftImpl::normal_init(double std) {
  backbone->normal_init(std);
  heads->reset_parameters(std);
}

}  // namespace fsdp::model
