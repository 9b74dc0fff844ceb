// The FeatureDataset interface's shared default (dataset.h): reading a row window from a sample
// read whole. Which format a path holds is the registry's question (formats.h).
#include "data/dataset.h"

#include <algorithm>

namespace fsdp::data {

RawSample FeatureDataset::read_rows(int64_t i, int64_t from, int64_t count) const {
  RawSample s = read(i);
  const int64_t S = s.aux_hidden_state.size(0);
  const int64_t begin = std::clamp<int64_t>(from, 0, S);
  const int64_t end = std::clamp<int64_t>(from + std::max<int64_t>(count, 0), begin, S);
  // Copies: the rows outside the window are released with the whole tensors. (A block draft's
  // features may have no last hidden state.)
  if (s.hidden_state.defined())
    s.hidden_state = s.hidden_state.narrow(0, begin, end - begin).clone();
  s.aux_hidden_state = s.aux_hidden_state.narrow(0, begin, end - begin).clone();
  s.row_offset = begin;
  return s;
}

}  // namespace fsdp::data
