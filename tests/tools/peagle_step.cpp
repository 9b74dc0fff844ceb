// Test helper: fsdp-train's P-EAGLE draft and step on a case written by
// tests/e2e/specforge_peagle_ref.py (SpecForge 0.2.0's own P-EAGLE step), so a script can compare
// them (tests/e2e/specforge_peagle.sh). Never used outside tests.
//
//   peagle_step CASE_DIR OUT.safetensors "NUM_DEPTHS RATIO RATIO_MIN SEED"
//
// CASE_DIR: config.json (PEagleDraftModel), weights.safetensors (SpecForge's state dict),
// inputs.safetensors (input_ids, attention_mask, loss_mask, hidden_state, target: the target's
// last hidden state, target_head.weight, and the reference's rows cod.sampled.d<d>: the
// positions a + d it kept at depth d); the sampling options and the seed the reference drew with.
// The inputs are shifted as SpecForge's TargetHead.preprocess does (input_ids and target left by
// one, zero last; loss_mask and hidden_state not). OUT: loss, sample_loss, sample_weight,
// depth_total, depth_correct, cod.same (1 when this build's sampling from the seed drew the
// reference's rows), and grad.<SpecForge name> of every parameter.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/peagle_config.h"
#include "model/peagle_model.h"
#include "model/peagle_sampling.h"
#include "model/peagle_step.h"
#include "model/target_head.h"

namespace {

at::Tensor shift_left(const at::Tensor& x) {
  return at::cat({x.narrow(1, 1, x.size(1) - 1), at::zeros_like(x.narrow(1, 0, 1))}, 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: peagle_step CASE_DIR OUT 'depths ratio ratio_min seed'\n");
    return 2;
  }
  try {
    using namespace fsdp;
    const std::string dir = argv[1];
    const model::PEagleConfig cfg = model::load_peagle_config(dir + "/config.json");
    auto weights = checkpoint::SafetensorsFile::open(dir + "/weights.safetensors");
    auto in = checkpoint::SafetensorsFile::open(dir + "/inputs.safetensors");
    const at::Tensor aux = in->read("hidden_state");
    model::PEagleDraft draft(cfg);
    draft->to(aux.scalar_type());
    {
      at::NoGradGuard guard;
      for (auto& p : draft->named_parameters())
        p.value().copy_(
            weights->read(model::PEagleDraftImpl::export_name(p.key())).view_as(p.value()));
    }
    const at::Tensor t2d = weights->read("t2d").to(at::kBool);
    draft->set_vocab_mapping(weights->read("d2t"), t2d);
    const model::TargetHead head(in->read("target_head.weight"), t2d);

    model::PEagleInputs x;
    x.input_ids = shift_left(in->read("input_ids"));
    x.attention_mask = in->read("attention_mask").to(at::kLong);
    x.loss_mask = in->read("loss_mask").to(at::kLong);
    x.host_loss_mask = x.loss_mask;
    x.aux_hidden = aux;
    x.target_hidden = shift_left(in->read("target"));
    const int64_t S = x.input_ids.size(1);

    model::CodOptions co;
    uint64_t seed = 0;
    std::istringstream(argv[3]) >> co.num_depths >> co.down_sample_ratio >>
        co.down_sample_ratio_min >> seed;
    // The reference's rows, and this build's own draw from the same seed.
    model::CodRows ref;
    ref.anchors.push_back({});
    for (int64_t p = 0; p < S; ++p) ref.anchors[0].push_back(p);
    for (int64_t d = 1; in->contains("cod.sampled.d" + std::to_string(d)); ++d) {
      const at::Tensor s = in->read("cod.sampled.d" + std::to_string(d)).to(at::kLong).contiguous();
      std::vector<int64_t> a;
      for (int64_t j = 0; j < s.numel(); ++j) a.push_back(s.data_ptr<int64_t>()[j] - d);
      if (!a.empty()) ref.anchors.push_back(a);
    }
    const at::Tensor lm = x.loss_mask[0].contiguous();
    std::vector<int64_t> mask(lm.data_ptr<int64_t>(), lm.data_ptr<int64_t>() + S);
    const int64_t valid = x.attention_mask[0].sum().item<int64_t>();
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const model::CodRows mine = model::cod_sample(mask, valid, co, gen);
    const bool same = mine.anchors == ref.anchors;

    model::PEagleStepOptions o;
    o.mask_token_id = *cfg.mask_token_id;
    o.head_chunk_rows = 7;  // several chunks: the chunked head's backward is exercised
    const model::PEagleStepOutput r = model::peagle_step(*draft, head, x, {ref}, co.num_depths, o);
    r.loss.backward();
    checkpoint::NamedTensors res{
        {"loss", r.loss.detach()},          {"sample_loss", r.sample_loss},
        {"sample_weight", r.sample_weight}, {"depth_total", r.depth_total},
        {"depth_correct", r.depth_correct}, {"cod.same", at::full({1}, same ? 1 : 0, at::kLong)}};
    for (auto& p : draft->named_parameters())
      if (p.value().grad().defined())
        res.emplace_back("grad." + model::PEagleDraftImpl::export_name(p.key()), p.value().grad());
    checkpoint::write_safetensors(argv[2], res);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peagle_step: %s\n", e.what());
    return 1;
  }
}
