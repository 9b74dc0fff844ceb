// COD depth sampling (model/peagle_sampling.h), step for step as SpecForge 0.2.0 draws it.
#include "model/peagle_sampling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fsdp::model {

int64_t CodRows::rows() const {
  int64_t n = 0;
  for (const auto& a : anchors) n += static_cast<int64_t>(a.size());
  return n;
}

CodRows cod_sample(const std::vector<int64_t>& loss_mask, int64_t valid, const CodOptions& opt,
                   at::Generator gen) {
  const int64_t S = static_cast<int64_t>(loss_mask.size());
  FSDP_CHECK(valid >= 0 && valid <= S,
             fsdp::str("valid length ", valid, " of a ", S, "-long sample"),
             "pass the sample's attention-mask length");
  FSDP_CHECK(opt.num_depths >= 1, "P-EAGLE needs at least one depth", "set num_depths >= 1");
  CodRows out;
  out.anchors.emplace_back(static_cast<size_t>(S));
  for (int64_t p = 0; p < S; ++p) out.anchors[0][static_cast<size_t>(p)] = p;
  std::vector<int64_t> valid_positions;  // loss positions, ascending
  for (int64_t p = 0; p < S; ++p)
    if (loss_mask[static_cast<size_t>(p)] == 1) valid_positions.push_back(p);
  // One document: [0, valid); padding has none, so an anchor or target there is never eligible.
  auto in_document = [&](int64_t p) { return p < valid; };
  std::vector<int64_t> prev = valid_positions;
  const auto n_valid = static_cast<int64_t>(valid_positions.size());
  for (int64_t d = 1; d < opt.num_depths; ++d) {
    std::vector<int64_t> eligible;  // targets p = a + d, ascending
    for (int64_t p : prev)
      if (p >= d && in_document(p) && in_document(p - d)) eligible.push_back(p);
    const int64_t valid_length = std::max<int64_t>(0, n_valid - d);
    const double ratio = std::max(std::pow(opt.down_sample_ratio, static_cast<double>(d)),
                                  opt.down_sample_ratio_min);
    const auto n_eligible = static_cast<int64_t>(eligible.size());
    const int64_t size =
        std::min(static_cast<int64_t>(static_cast<double>(valid_length) * ratio), n_eligible);
    if (size <= 0) break;
    std::vector<int64_t> sampled;
    if (n_eligible > size) {
      const at::Tensor perm = at::randperm(n_eligible, gen, at::TensorOptions().dtype(at::kLong));
      const int64_t* idx = perm.data_ptr<int64_t>();
      for (int64_t j = 0; j < size; ++j) sampled.push_back(eligible[static_cast<size_t>(idx[j])]);
      std::sort(sampled.begin(), sampled.end());
      out.randperm_sizes.push_back(n_eligible);
    } else {
      sampled = eligible;
    }
    std::vector<int64_t> anchors;
    anchors.reserve(sampled.size());
    for (int64_t p : sampled) anchors.push_back(p - d);
    out.anchors.push_back(std::move(anchors));
    // The next depth's candidates: the next positions (wrapping to 0, which is dropped) that are
    // loss positions.
    prev.clear();
    for (int64_t p : sampled) {
      const int64_t next = (p + 1) % S;
      if (next != 0 && loss_mask[static_cast<size_t>(next)] == 1) prev.push_back(next);
    }
  }
  return out;
}

}  // namespace fsdp::model
