// Test helper: fsdp-train's DSpark objective (labels, heads, terms, loss and its gradients) for
// given heads' weights and inputs, so a script can compare it with SpecForge's own
// OnlineDSparkModel (tests/e2e/specforge_dspark.sh). Never used outside tests.
//
//   dspark_objective CASE_DIR...
//
// Each CASE_DIR holds config.json (the draft config), weights.safetensors (the heads' parameters
// under SpecForge's names) and inputs.safetensors: input_ids int64 [B,S], loss_mask [B,S],
// anchors int64 [B,N], keep_mask bool [B,N], hidden4d [B,N,bs,H] (float32 or float64),
// lm_head [V,H], optionally target_last_hidden [B,S,H], and options float64 [5] = (loss decay
// gamma, <= 0 for none; ce alpha; l1 alpha; confidence alpha; objective chunk blocks). Writes
// CASE_DIR/out.safetensors: loss, every term by its DSparkTerms name, target_ids, eval_mask,
// prev_token_ids, loss_weights, grad.hidden4d and grad.<parameter name> of every head parameter.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/dspark_heads.h"
#include "model/dspark_objective.h"

namespace {

using namespace fsdp;

void run_case(const std::string& dir) {
  const model::DSparkHeadsConfig cfg = model::load_dspark_heads_config(dir + "/config.json");
  model::DSparkHeads heads(cfg);
  auto weights = checkpoint::SafetensorsFile::open(dir + "/weights.safetensors");
  auto inputs = checkpoint::SafetensorsFile::open(dir + "/inputs.safetensors");
  const at::Tensor hidden = inputs->read("hidden4d").requires_grad_(true);
  heads->to(hidden.scalar_type());
  {
    at::NoGradGuard guard;
    for (auto& p : heads->named_parameters()) p.value().copy_(weights->read(p.key()));
  }
  const at::Tensor opts = inputs->read("options");
  const double gamma = opts[0].item<double>();
  const model::DSparkAlphas alphas{opts[1].item<double>(), opts[2].item<double>(),
                                   opts[3].item<double>()};
  const int64_t chunk = static_cast<int64_t>(opts[4].item<double>());

  const at::Tensor ids = inputs->read("input_ids"), anchors = inputs->read("anchors");
  const auto labels = model::dspark_block_labels(ids, inputs->read("loss_mask"), anchors,
                                                 inputs->read("keep_mask"), hidden.size(2));
  model::DSparkObjectiveInputs in;
  in.hidden4d = hidden;
  in.prev_token_ids = model::dspark_prev_token_ids(ids, anchors, labels.target_ids);
  in.target_ids = labels.target_ids;
  in.eval_mask = labels.eval_mask;
  in.loss_weights = model::dspark_loss_weights(
      labels.eval_mask, gamma > 0 ? std::optional<double>(gamma) : std::nullopt);
  if (inputs->contains("target_last_hidden")) {
    in.aligned_target_hidden = model::dspark_aligned_target_hidden(
        inputs->read("target_last_hidden"), labels.safe_label_indices);
  }
  in.lm_head_weight = inputs->read("lm_head");
  const model::DSparkTerms t = model::dspark_objective(heads, in, alphas, chunk);
  const at::Tensor loss = model::dspark_loss(t, alphas, in.loss_weights.sum());
  loss.backward();

  checkpoint::NamedTensors out{{"loss", loss.detach()},
                               {"ce_num", t.ce_num.detach()},
                               {"l1_num", t.l1_num.detach()},
                               {"confidence_num", t.confidence_num.detach()},
                               {"confidence_error_num", t.confidence_error_num},
                               {"correct_num", t.correct_num},
                               {"eval_den", t.eval_den},
                               {"ce_position_num", t.ce_position_num},
                               {"correct_position_num", t.correct_position_num},
                               {"position_den", t.position_den},
                               {"teacher_agreement_num", t.teacher_agreement_num},
                               {"teacher_top1_num", t.teacher_top1_num},
                               {"draft_top1_num", t.draft_top1_num},
                               {"tau_num", t.tau_num},
                               {"tau_den", t.tau_den},
                               {"has_target", at::scalar_tensor(t.has_target ? 1 : 0, at::kLong)},
                               {"target_ids", labels.target_ids},
                               {"eval_mask", labels.eval_mask},
                               {"prev_token_ids", in.prev_token_ids},
                               {"loss_weights", in.loss_weights},
                               {"grad.hidden4d", hidden.grad()}};
  for (const auto& p : heads->named_parameters()) {
    const at::Tensor g = p.value().grad();
    out.emplace_back("grad." + p.key(), g.defined() ? g : at::zeros_like(p.value()));
  }
  for (auto& [name, tensor] : out) tensor = tensor.contiguous();
  checkpoint::write_safetensors(dir + "/out.safetensors", out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dspark_objective CASE_DIR...\n");
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    try {
      run_case(argv[i]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dspark_objective: %s: %s\n", argv[i], e.what());
      return 1;
    }
  }
  return 0;
}
