// Test helper: fsdp-train's DFlash draft and objective on given weights, inputs and anchors, so a
// script can compare them with SpecForge's OnlineDFlashModel (tests/e2e/specforge_dflash.sh).
// Never used outside tests.
//
//   dflash_loss CONFIG.json WEIGHTS.safetensors INPUTS.safetensors OUT.safetensors OPTIONS
//
// WEIGHTS: the draft's state dict (SpecForge's names). INPUTS: input_ids int64 [B,S], loss_mask
// [B,S], hidden_states float [B,S,n*H], anchors int64 [B,N], keep bool [B,N], embed [V,H],
// lm_head [V,H]. OPTIONS: "loss_type mask_token chunk_blocks gamma dpace_alpha" (gamma <= 0:
// none). OUT: loss, loss_num, loss_den (the denominator used), correct, accuracy_den, accept_num,
// accept_den, output_hidden [B,N*bs,H], and grad.<name> of every draft parameter and
// grad.hidden_states.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/block_targets.h"
#include "model/dflash_config.h"
#include "model/dflash_model.h"
#include "model/dflash_objective.h"

namespace {

fsdp::model::BlockLoss loss_named(const std::string& s) {
  using fsdp::model::BlockLoss;
  if (s == "dflash") return BlockLoss::kDFlash;
  if (s == "dpace") return BlockLoss::kDPace;
  if (s == "dpace-cumulative-confidence-only") return BlockLoss::kDPaceCumulativeConfidence;
  if (s == "dpace-continuation-value-only") return BlockLoss::kDPaceContinuationValue;
  throw std::runtime_error("unknown loss type " + s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: dflash_loss CONFIG WEIGHTS INPUTS OUT 'loss mask chunk gamma alpha'\n");
    return 2;
  }
  try {
    using namespace fsdp;
    const model::DFlashConfig cfg = model::load_dflash_config(argv[1]);
    std::istringstream opts(argv[5]);
    std::string loss_type;
    int64_t mask_token = 0;
    double gamma = 0;
    model::DFlashObjectiveOptions o;
    opts >> loss_type >> mask_token >> o.chunk_blocks >> gamma >> o.dpace_alpha;
    o.loss = loss_named(loss_type);
    if (gamma > 0) o.decay_gamma = gamma;
    model::DFlashDraft draft(cfg);
    auto weights = checkpoint::SafetensorsFile::open(argv[2]);
    auto in = checkpoint::SafetensorsFile::open(argv[3]);
    at::Tensor hidden = in->read("hidden_states").requires_grad_(true);
    draft->to(hidden.scalar_type());
    {
      at::NoGradGuard guard;
      for (auto& p : draft->named_parameters()) p.value().copy_(weights->read(p.key()));
    }
    const at::Tensor ids = in->read("input_ids"), mask = in->read("loss_mask");
    model::BlockLayout layout;
    layout.anchors = in->read("anchors");
    layout.keep = in->read("keep").to(at::kBool);
    layout.context_len = ids.size(1);
    layout.block_size = cfg.block_size;
    const at::Tensor noise =
        at::embedding(in->read("embed"), model::block_input_ids(ids, layout, mask_token));
    const at::Tensor out = draft->forward(noise, hidden, layout);
    const model::BlockLabels labels = model::dflash_labels(ids, mask, layout);
    const auto B = ids.size(0), N = layout.num_blocks();
    const model::DFlashTerms t = model::dflash_objective(out.view({B, N, cfg.block_size, -1}),
                                                         labels, in->read("lm_head"), o);
    // The denominator the loss divides by: the weights' sum (dflash) or the batch size (D-PACE).
    const at::Tensor den = o.loss == model::BlockLoss::kDFlash
                               ? t.loss_den
                               : at::full({}, static_cast<double>(B), t.loss_num.options());
    const at::Tensor loss = t.loss_num / den;
    loss.backward();
    checkpoint::NamedTensors res{{"loss", loss.detach()},
                                 {"loss_num", t.loss_num.detach()},
                                 {"loss_den", den},
                                 {"correct", t.correct},
                                 {"accuracy_den", t.accuracy_den},
                                 {"accept_num", t.accept_num},
                                 {"accept_den", t.accept_den},
                                 {"output_hidden", out.detach()},
                                 {"grad.hidden_states", hidden.grad()}};
    for (auto& p : draft->named_parameters()) res.emplace_back("grad." + p.key(), p.value().grad());
    checkpoint::write_safetensors(argv[4], res);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash_loss: %s\n", e.what());
    return 1;
  }
}
