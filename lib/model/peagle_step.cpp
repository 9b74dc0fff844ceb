// One P-EAGLE micro-batch (model/peagle_step.h).
#include "model/peagle_step.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"

namespace fsdp::model {

CodRows dense_rows(int64_t seq_len, int64_t depths) {
  CodRows r;
  for (int64_t d = 0; d < std::min(depths, seq_len); ++d) {
    std::vector<int64_t> a(static_cast<size_t>(seq_len - d));
    for (int64_t i = 0; i < seq_len - d; ++i) a[static_cast<size_t>(i)] = i;
    r.anchors.push_back(std::move(a));
  }
  return r;
}

PEagleStepOutput peagle_step(PEagleDraftImpl& draft, const TargetHead& head, const PEagleInputs& in,
                             const std::vector<CodRows>& rows, int64_t depths,
                             const PEagleStepOptions& opt) {
  const int64_t B = in.input_ids.size(0), S = in.input_ids.size(1);
  FSDP_CHECK(static_cast<int64_t>(rows.size()) == B,
             fsdp::str(rows.size(), " depth samplings for ", B, " samples"),
             "sample the rows of every sample of the micro-batch");
  const at::Tensor lm = in.host_loss_mask.to(at::kLong).contiguous();
  FSDP_CHECK(lm.device().is_cpu() && lm.size(0) == B && lm.size(1) == S,
             "host_loss_mask must be the batch's loss mask on the host", "copy it once");
  const int64_t* mask = lm.data_ptr<int64_t>();
  int64_t D = 0;  // depths computed: the deepest any sample kept
  for (const auto& r : rows) D = std::max(D, r.depths());
  FSDP_CHECK(D <= depths, fsdp::str("rows of ", D, " depths, metrics of ", depths),
             "sample with num_depths = the metric width");

  // The rows that reach the vocabulary: kept rows whose position a + d is a loss position (the
  // others weigh 0 whatever the target says). draft_row indexes depth d's [B * S] output, grouped
  // by depth; target_row is b * S + a + d.
  std::vector<int64_t> target_row, sample_of, depth_of, anchor_of, loss_of;
  std::vector<std::vector<int64_t>> draft_row(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d)
    for (int64_t b = 0; b < B; ++b) {
      const auto& r = rows[static_cast<size_t>(b)];
      if (d >= r.depths()) continue;
      for (int64_t a : r.anchors[static_cast<size_t>(d)]) {
        const int64_t p = a + d;
        if (p >= S || (mask[b * S + p] != 1 && !opt.all_rows)) continue;
        draft_row[static_cast<size_t>(d)].push_back(b * S + a);
        target_row.push_back(b * S + p);
        sample_of.push_back(b);
        depth_of.push_back(d);
        anchor_of.push_back(a);
        loss_of.push_back(mask[b * S + p] == 1 ? 1 : 0);
      }
    }
  const c10::Device dev = in.input_ids.device();
  auto to_dev = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(dev);
  };

  // Forward of every depth: depth 0 reads the tokens and the target's layers, depth d >= 1 the
  // mask token and fc(mask_hidden) at every anchor, as decode step d.
  const SeqLayout layout(in.attention_mask);
  DraftCache cache;
  const at::Tensor e0 = draft.embed(in.input_ids);
  const at::Tensor h0 = draft.project_aux(in.aux_hidden);
  std::vector<at::Tensor> picked;
  at::Tensor out = draft.decode(e0, h0, 0, cache, layout, opt.impl);
  if (!draft_row[0].empty())
    picked.push_back(out.reshape({B * S, -1}).index_select(0, to_dev(draft_row[0])));
  if (D > 1) {
    const at::Tensor mask_ids = at::full({1, 1}, opt.mask_token_id, in.input_ids.options());
    const at::Tensor em = draft.embed(mask_ids).expand({B, S, -1});
    const at::Tensor hm = draft.project_mask().expand({B, S, -1});
    for (int64_t d = 1; d < D; ++d) {
      out = draft.decode(em, hm, d, cache, layout, opt.impl);
      if (!draft_row[static_cast<size_t>(d)].empty())
        picked.push_back(
            out.reshape({B * S, -1}).index_select(0, to_dev(draft_row[static_cast<size_t>(d)])));
    }
  }

  PEagleStepOutput result;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(dev);
  result.depth_total = at::zeros({depths}, f64);
  result.depth_correct = at::zeros({depths}, f64);
  result.sample_loss = at::zeros({B}, f64);
  result.sample_weight = at::zeros({B}, f64);
  const auto N = static_cast<int64_t>(target_row.size());
  if (N == 0) {
    // Nothing to learn from (no loss position): a zero that still reaches every parameter.
    result.loss = out.sum() * 0.0;
    return result;
  }
  const at::Tensor x = at::cat(picked, 0);  // [N, H]
  const RowTarget t = head.compute_rows(in.target_hidden, to_dev(target_row));
  const at::Tensor sample = to_dev(sample_of), depth = to_dev(depth_of);
  const at::Tensor w = t.in_draft.to(at::kDouble) * to_dev(loss_of).to(at::kDouble);
  const at::Tensor wsum = at::zeros({B}, f64).index_add_(0, sample, w);
  // Each row's weight in the micro-batch's loss: its own over its sample's weight sum (at least
  // 1e-6, as SpecForge clamps it), over the samples and the divisor.
  const at::Tensor scale =
      w / wsum.clamp_min(1e-6).index_select(0, sample) / (static_cast<double>(B) * opt.divisor);
  const at::Tensor pred = at::empty({N}, at::TensorOptions().dtype(at::kLong).device(dev));
  const at::Tensor ce_rows = at::empty({N}, f64);
  Eagle3DraftImpl::HeadFns fns;
  const at::Tensor target_p = t.target_p;
  fns.values = [target_p, scale, ce_rows](const at::Tensor& z, int64_t from) {
    const int64_t n = z.size(0);
    const at::Tensor zz = z.scalar_type() == at::kDouble ? z : z.to(at::kFloat);
    const at::Tensor p = target_p.narrow(0, from, n).to(zz.scalar_type());
    const at::Tensor ce = -(p * at::log_softmax(zz, -1)).sum(-1);  // [n]
    if (!at::GradMode::is_enabled()) ce_rows.narrow(0, from, n).copy_(ce);
    return (ce * scale.narrow(0, from, n).to(ce.scalar_type())).unsqueeze(0);
  };
  fns.inspect = [pred](const at::Tensor& z, int64_t from) {
    pred.narrow(0, from, z.size(0)).copy_(z.argmax(-1));
  };
  const at::Tensor values = draft.head_rows(x, std::max<int64_t>(1, opt.head_chunk_rows), fns);
  result.loss = values.sum();
  {
    at::NoGradGuard guard;
    const at::Tensor hit = pred.eq(t.target_best).to(at::kDouble) * w;
    result.depth_total.index_add_(0, depth, w);
    result.depth_correct.index_add_(0, depth, hit);
    result.sample_weight = wsum;
    result.sample_loss.index_add_(0, sample, ce_rows * w);
    result.sample_loss.div_(wsum.clamp_min(1e-6));
    if (opt.all_rows) {
      const at::Tensor mapped = pred + draft.d2t.index_select(0, pred);
      result.hits = at::full({B, depths, S}, -1, pred.options());
      result.hits.index_put_({sample, depth, to_dev(anchor_of)},
                             mapped.eq(t.target_ids).to(at::kLong));
    }
  }
  return result;
}

}  // namespace fsdp::model
