// Test helper: fsdp-train's Muon step (optim/muon.h) over whole matrices, so a script can compare
// it with torch.optim.Muon (tests/e2e/torch_muon.sh). Never used outside tests.
//
//   muon_step IN.safetensors OUT.safetensors "LR MOMENTUM NESTEROV WEIGHT_DECAY NS_STEPS ADJUST"
//
// IN: param.<k> (fp32 2-D) and grad.<k>.<s> for steps s = 0, 1, ...; ADJUST: original or
// match_rms_adamw. OUT: param.<k> and momentum.<k> after every step.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "optim/muon.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: muon_step IN OUT 'lr momentum nesterov wd ns_steps adjust'\n");
    return 2;
  }
  try {
    using namespace fsdp;
    optim::MuonOptions o;
    double lr = 0;
    int nesterov = 1;
    std::string adjust;
    std::istringstream(argv[3]) >> lr >> o.momentum >> nesterov >> o.weight_decay >> o.ns_steps >>
        adjust;
    o.nesterov = nesterov != 0;
    o.adjust_lr =
        adjust == "original" ? optim::MuonAdjustLr::kOriginal : optim::MuonAdjustLr::kMatchRmsAdamW;
    o.validate();
    auto in = checkpoint::SafetensorsFile::open(argv[1]);
    checkpoint::NamedTensors out;
    for (int k = 0; in->contains("param." + std::to_string(k)); ++k) {
      const std::string key = std::to_string(k);
      at::Tensor p = in->read("param." + key).clone();
      at::Tensor buf = at::zeros_like(p);
      for (int s = 0; in->contains("grad." + key + "." + std::to_string(s)); ++s)
        optim::muon_update(p, in->read("grad." + key + "." + std::to_string(s)), buf, lr, o);
      out.emplace_back("param." + key, p);
      out.emplace_back("momentum." + key, buf);
    }
    checkpoint::write_safetensors(argv[2], out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "muon_step: %s\n", e.what());
    return 1;
  }
}
