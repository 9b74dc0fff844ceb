// P-EAGLE's depth sampling (docs/model.md "P-EAGLE"): which (anchor, depth) rows of a sample a
// training step computes the loss on, as SpecForge 0.2.0's generate_cod_sample_indices draws them
// (speculators' COD sampling). Depth 0 is every position; depth d >= 1 keeps a fraction
// max(r^d, r_min) of the loss positions whose anchor a = p - d lies in the same document, drawn
// by one randperm per depth from the caller's generator; a row (a, d) is only drawn when (a, d-1)
// was, so each depth's rows are a subset of the previous depth's anchors. Host-side, no torch
// device work: the rows decide which positions reach the vocabulary.
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <vector>

namespace fsdp::model {

struct CodOptions {
  int64_t num_depths = 8;              // K: depths 0 .. K-1
  double down_sample_ratio = 0.8;      // r (SpecForge's YAML default; its class default is 0.7)
  double down_sample_ratio_min = 0.2;  // r_min, the floor of r^d
};

// The rows of one sample: anchors[d] the sorted anchors a of depth d (the row predicts position
// a + d); anchors[0] is 0 .. S-1. Stops at the first depth that keeps nothing.
struct CodRows {
  std::vector<std::vector<int64_t>> anchors;
  // The n of each randperm(n) drawn, in order (what a reference must draw to agree).
  std::vector<int64_t> randperm_sizes;
  int64_t depths() const { return static_cast<int64_t>(anchors.size()); }
  int64_t rows() const;
};

// loss_mask: S host values (0/1) of the sample, aligned as the draft's rows are (position p's
// loss flag); valid: the sample's real length (positions >= valid are padding, document -1).
// `gen` (a CPU generator) supplies every random draw; the same generator state gives the same
// rows as SpecForge's torch.randperm on the CPU.
CodRows cod_sample(const std::vector<int64_t>& loss_mask, int64_t valid, const CodOptions& opt,
                   at::Generator gen);

}  // namespace fsdp::model
