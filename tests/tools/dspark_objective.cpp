// Test helper: fsdp-train's DSpark objective (labels, heads, terms, loss and its gradients) for
// given heads' weights and inputs, and fsdp-train's whole DSpark step (model/dspark_step.h:
// backbone, heads and objective) for a whole draft's weights, so a script can compare them with
// SpecForge's own OnlineDSparkModel (tests/e2e/specforge_dspark.sh). Never used outside tests.
//
//   dspark_objective CASE_DIR...
//
// Each CASE_DIR holds config.json (the draft config), weights.safetensors and inputs.safetensors:
// input_ids int64 [B,S], loss_mask [B,S], anchors int64 [B,N], keep_mask bool [B,N], lm_head
// [V,H], optionally target_last_hidden [B,S,H], options float64 [5] = (loss decay gamma, <= 0 for
// none; ce alpha; l1 alpha; confidence alpha; objective chunk blocks), and either
// - hidden4d [B,N,bs,H] (float32 or float64), the backbone's output: the objective alone, the
//   weights being the heads' parameters under SpecForge's names; or
// - hidden_states [B,S,n*H] (the target layers' features) and embed [V,H]: the whole step, the
//   weights being the whole draft's state dict (SpecForge's DSparkDraftModel names).
// Writes CASE_DIR/out.safetensors: loss, every term by its DSparkTerms name, target_ids,
// eval_mask, prev_token_ids, loss_weights, accepted (int64 [B,N]: each block's accepted count,
// what the trainer's evaluation walks), grad.hidden4d or grad.hidden_states, and
// grad.<parameter name> of every parameter read from the weights.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "model/block_targets.h"
#include "model/dflash_config.h"
#include "model/dspark_draft.h"
#include "model/dspark_heads.h"
#include "model/dspark_objective.h"
#include "model/dspark_step.h"

namespace {

using namespace fsdp;

struct Options {
  double gamma = 0;
  model::DSparkAlphas alphas;
  int64_t chunk = 0;
};

Options read_options(checkpoint::SafetensorsFile& inputs) {
  const at::Tensor opts = inputs.read("options");
  return {opts[0].item<double>(),
          {opts[1].item<double>(), opts[2].item<double>(), opts[3].item<double>()},
          static_cast<int64_t>(opts[4].item<double>())};
}

std::optional<double> decay(const Options& o) {
  return o.gamma > 0 ? std::optional<double>(o.gamma) : std::nullopt;
}

void load_weights(torch::nn::Module& module, checkpoint::SafetensorsFile& weights) {
  at::NoGradGuard guard;
  for (auto& p : module.named_parameters()) p.value().copy_(weights.read(p.key()));
}

checkpoint::NamedTensors terms_out(const at::Tensor& loss, const model::DSparkTerms& t,
                                   const model::DSparkBlockLabels& labels,
                                   const at::Tensor& prev_token_ids, const at::Tensor& loss_weights,
                                   const std::vector<at::Tensor>& accepted) {
  return {{"loss", loss.detach()},
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
          {"prev_token_ids", prev_token_ids},
          {"loss_weights", loss_weights},
          {"accepted", at::cat(accepted, 1)}};
}

void write_out(const std::string& dir, checkpoint::NamedTensors out, torch::nn::Module& module) {
  for (const auto& p : module.named_parameters()) {
    const at::Tensor g = p.value().grad();
    out.emplace_back("grad." + p.key(), g.defined() ? g : at::zeros_like(p.value()));
  }
  for (auto& [name, tensor] : out) tensor = tensor.contiguous();
  checkpoint::write_safetensors(dir + "/out.safetensors", out);
}

// The objective alone, on a given backbone output.
void run_objective(const std::string& dir, checkpoint::SafetensorsFile& weights,
                   checkpoint::SafetensorsFile& inputs) {
  const model::DSparkHeadsConfig cfg = model::load_dspark_heads_config(dir + "/config.json");
  model::DSparkHeads heads(cfg);
  const at::Tensor hidden = inputs.read("hidden4d").requires_grad_(true);
  heads->to(hidden.scalar_type());
  load_weights(*heads, weights);
  const Options o = read_options(inputs);

  const at::Tensor ids = inputs.read("input_ids"), anchors = inputs.read("anchors");
  const auto labels = model::dspark_block_labels(ids, inputs.read("loss_mask"), anchors,
                                                 inputs.read("keep_mask"), hidden.size(2));
  model::DSparkObjectiveInputs in;
  in.hidden4d = hidden;
  in.prev_token_ids = model::dspark_prev_token_ids(ids, anchors, labels.target_ids);
  in.target_ids = labels.target_ids;
  in.eval_mask = labels.eval_mask;
  in.loss_weights = model::dspark_loss_weights(labels.eval_mask, decay(o));
  if (inputs.contains("target_last_hidden")) {
    in.aligned_target_hidden = model::dspark_aligned_target_hidden(
        inputs.read("target_last_hidden"), labels.safe_label_indices);
  }
  in.lm_head_weight = inputs.read("lm_head");
  std::vector<at::Tensor> accepted;
  const model::DSparkTerms t = model::dspark_objective(heads, in, o.alphas, o.chunk, &accepted);
  const at::Tensor loss = model::dspark_loss(t, o.alphas, in.loss_weights.sum());
  loss.backward();
  checkpoint::NamedTensors out =
      terms_out(loss, t, labels, in.prev_token_ids, in.loss_weights, accepted);
  out.emplace_back("grad.hidden4d", hidden.grad());
  write_out(dir, std::move(out), *heads);
}

// The whole step: backbone, heads and objective (model/dspark_step.h), as the trainer runs it.
void run_step(const std::string& dir, checkpoint::SafetensorsFile& weights,
              checkpoint::SafetensorsFile& inputs) {
  const model::DFlashConfig backbone = model::load_dflash_config(dir + "/config.json");
  model::DSparkDraft draft(backbone, model::load_dspark_heads_config(dir + "/config.json"));
  const at::Tensor context = inputs.read("hidden_states").requires_grad_(true);
  draft->to(context.scalar_type());
  load_weights(*draft, weights);
  const Options o = read_options(inputs);

  const at::Tensor ids = inputs.read("input_ids"), mask = inputs.read("loss_mask");
  model::BlockLayout layout;
  layout.anchors = inputs.read("anchors");
  layout.keep = inputs.read("keep_mask").to(at::kBool);
  layout.context_len = ids.size(1);
  layout.block_size = backbone.block_size;
  model::DSparkStepInputs in;
  in.embedded = at::embedding(inputs.read("embed"),
                              model::block_input_ids(ids, layout, backbone.require_mask_token()));
  in.context = context;
  in.layout = &layout;
  in.input_ids = ids;
  in.loss_mask = mask;
  if (inputs.contains("target_last_hidden"))
    in.target_hidden = inputs.read("target_last_hidden").to(context.scalar_type());
  in.lm_head = inputs.read("lm_head");
  in.decay_gamma = decay(o);
  in.alphas = o.alphas;
  in.chunk_blocks = o.chunk;
  std::vector<at::Tensor> accepted;
  in.accepted_blocks = &accepted;
  const model::DSparkStep step = model::dspark_step(*draft, in);
  const at::Tensor loss = model::dspark_loss(step.terms, o.alphas, step.loss_weights.sum());
  loss.backward();
  checkpoint::NamedTensors out =
      terms_out(loss, step.terms, step.labels, step.prev_token_ids, step.loss_weights, accepted);
  out.emplace_back("grad.hidden_states", context.grad());
  write_out(dir, std::move(out), *draft);
}

void run_case(const std::string& dir) {
  auto weights = checkpoint::SafetensorsFile::open(dir + "/weights.safetensors");
  auto inputs = checkpoint::SafetensorsFile::open(dir + "/inputs.safetensors");
  if (inputs->contains("hidden_states"))
    run_step(dir, *weights, *inputs);
  else
    run_objective(dir, *weights, *inputs);
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
