// TTT-step attention: the efficient path runs a fused causal SDPA kernel over the step-0 keys,
// then merges the i diagonal scores exactly through the log-sum-exp; backward hands the merged
// output and log-sum-exp to the kernel's own backward (it recomputes P = exp(S - lse) and
// D = rowsum(dO * O), which then are the probabilities and D of the full softmax), plus a
// closed-form backward for the diagonal keys. Never materialises S x S scores outside the
// dense reference.
#include "model/ttt_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "core/log.h"
#include "kernels/fused.h"

namespace fsdp::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::ScalarType acc_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Repeats kv heads for GQA: [B, nkv, S, d] -> [B, nkv*g, S, d] (head h uses kv head h / g).
at::Tensor expand_kv(const at::Tensor& x, int64_t groups) {
  return groups == 1 ? x : x.repeat_interleave(groups, 1);
}

// Sums the gradient of expanded heads back to kv heads.
at::Tensor reduce_kv(const at::Tensor& g, int64_t groups) {
  if (groups == 1) return g;
  auto s = g.sizes();
  return g.view({s[0], s[1] / groups, groups, s[2], s[3]}).sum(2);
}

enum class Kernel { kCpuFlash, kCudaFlash, kCudaEfficient, kNone };

Kernel pick_kernel(const at::Tensor& q) {
  const auto dt = q.scalar_type();
  if (q.device().is_cpu()) {
    return (dt == at::kFloat || dt == at::kDouble || dt == at::kBFloat16 || dt == at::kHalf)
               ? Kernel::kCpuFlash
               : Kernel::kNone;
  }
  if (q.device().is_cuda()) {
    const int64_t d = q.size(-1);
    if ((dt == at::kBFloat16 || dt == at::kHalf) && d % 8 == 0 && d <= 256)
      return Kernel::kCudaFlash;
    if (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf) return Kernel::kCudaEfficient;
  }
  return Kernel::kNone;
}

// What the fused forward returns that its backward needs again.
struct CausalResult {
  at::Tensor out;  // [B, nh, S, d]
  at::Tensor lse;  // kernel layout (may be padded along the last dim); first S entries valid
  at::Tensor cum_q, cum_k, seed, offset;
};

CausalResult causal_forward(Kernel kernel, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
  CausalResult r;
  switch (kernel) {
    case Kernel::kCpuFlash:
      std::tie(r.out, r.lse) =
          at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, true, {}, scale);
      break;
    case Kernel::kCudaFlash: {
      auto res = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, true, false, scale);
      r.out = std::get<0>(res);
      r.lse = std::get<1>(res);
      r.cum_q = std::get<2>(res);
      r.cum_k = std::get<3>(res);
      r.seed = std::get<6>(res);
      r.offset = std::get<7>(res);
      break;
    }
    case Kernel::kCudaEfficient: {
      auto res = at::_scaled_dot_product_efficient_attention(q, k, v, {}, true, 0.0, true, scale);
      r.out = std::get<0>(res);
      r.lse = std::get<1>(res);
      r.seed = std::get<2>(res);
      r.offset = std::get<3>(res);
      break;
    }
    case Kernel::kNone:
      FSDP_ASSERT(false, "causal_forward without a kernel");
  }
  return r;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> causal_backward(
    Kernel kernel, const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cum_q,
    const at::Tensor& cum_k, const at::Tensor& seed, const at::Tensor& offset, double scale) {
  const int64_t S = q.size(2);
  switch (kernel) {
    case Kernel::kCpuFlash:
      return at::_scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0,
                                                                      true, {}, scale);
    case Kernel::kCudaFlash:
      return at::_scaled_dot_product_flash_attention_backward(
          grad, q, k, v, out, lse, cum_q, cum_k, S, k.size(2), 0.0, true, seed, offset, scale);
    case Kernel::kCudaEfficient: {
      auto r = at::_scaled_dot_product_efficient_attention_backward(
          grad, q, k, v, at::Tensor(), out, lse, seed, offset, 0.0, {true, true, true, false}, true,
          scale);
      return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    }
    case Kernel::kNone:
      break;
  }
  FSDP_ASSERT(false, "causal_backward without a kernel");
  return {};
}

// Diagonal scores [B, nkv, g, S, i] in the accumulation dtype.
at::Tensor diagonal_scores(const at::Tensor& q5, const at::Tensor& kd, double scale) {
  return at::einsum("bkgsd,bksjd->bkgsj", {q5, kd}) * scale;
}

// Custom autograd function over (q, k0, v0, kd, vd); kd/vd are [B, nkv, S, i, d] (i may be 0).
// `docs`: the packed documents' lengths (one kernel call each), or empty (one call over S).
struct TttAttentionFn : public torch::autograd::Function<TttAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor q, at::Tensor k0, at::Tensor v0,
                            at::Tensor kd, at::Tensor vd, double scale, int64_t kernel_id,
                            std::vector<int64_t> docs, bool fused) {
    const auto kernel = static_cast<Kernel>(kernel_id);
    const int64_t B = q.size(0), nh = q.size(1), S = q.size(2), d = q.size(3);
    const int64_t nkv = k0.size(1), g = nh / nkv, steps = kd.size(3);
    const auto acc = acc_dtype(q);
    at::Tensor k0e = expand_kv(k0, g), v0e = expand_kv(v0, g);
    // The causal part: one call over S, or one per document (each its own causal attention).
    std::vector<CausalResult> parts;
    at::Tensor c_out, lse_c;  // [B, nh, S, d] and [B, nh, S] (acc)
    if (docs.empty()) {
      parts.push_back(causal_forward(kernel, q, k0e, v0e, scale));
      c_out = parts[0].out;
      lse_c = parts[0].lse.narrow(-1, 0, S).to(acc);
    } else {
      std::vector<at::Tensor> outs, lses;
      int64_t s0 = 0;
      for (const int64_t L : docs) {
        parts.push_back(causal_forward(kernel, q.narrow(2, s0, L).contiguous(),
                                       k0e.narrow(2, s0, L).contiguous(),
                                       v0e.narrow(2, s0, L).contiguous(), scale));
        outs.push_back(parts.back().out);
        lses.push_back(parts.back().lse.narrow(-1, 0, L));
        s0 += L;
      }
      c_out = at::cat(outs, 2);
      lse_c = at::cat(lses, -1).to(acc);
    }
    at::Tensor out, total = lse_c;
    fused = fused && steps > 0 && kernels::ttt_merge_supported(q, steps);
    if (steps == 0) {
      out = c_out;
    } else if (fused) {
      kernels::Merge m = kernels::ttt_merge_forward(q, c_out, lse_c, kd, vd, scale);
      out = std::move(m.out);
      total = std::move(m.total);
    } else {
      at::Tensor q5 = q.to(acc).reshape({B, nkv, g, S, d});
      at::Tensor sd = diagonal_scores(q5, kd.to(acc), scale);  // [B,nkv,g,S,i]
      at::Tensor lse5 = lse_c.reshape({B, nkv, g, S});
      at::Tensor total5 = at::logaddexp(lse5, sd.logsumexp(-1));  // [B,nkv,g,S]
      at::Tensor pd = (sd - total5.unsqueeze(-1)).exp();
      at::Tensor od = at::einsum("bkgsj,bksjd->bkgsd", {pd, vd.to(acc)});
      at::Tensor wc = (lse5 - total5).exp().unsqueeze(-1);
      at::Tensor merged = wc * c_out.to(acc).reshape({B, nkv, g, S, d}) + od;
      out = merged.reshape({B, nh, S, d}).to(q.scalar_type()).contiguous();
      total = total5.reshape({B, nh, S});
    }
    // The kernel's backward reads the log-sum-exp in its own layout: backward writes the merged
    // one (total) into a copy of each call's.
    std::vector<at::Tensor> saved{q, k0, v0, kd, vd, out, total};
    for (const CausalResult& c : parts) {
      saved.insert(saved.end(), {c.lse, c.cum_q, c.cum_k, c.seed, c.offset});
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["kernel"] = kernel_id;
    ctx->saved_data["docs"] = docs;
    ctx->saved_data["merged"] = steps > 0;
    ctx->saved_data["fused"] = fused;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k0 = saved[1], &v0 = saved[2], &kd = saved[3], &vd = saved[4],
                     &out = saved[5], &total_lse = saved[6];
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto kernel = static_cast<Kernel>(ctx->saved_data["kernel"].toInt());
    const std::vector<int64_t> docs = ctx->saved_data["docs"].toIntVector();
    const bool merged = ctx->saved_data["merged"].toBool();
    const bool fused = ctx->saved_data["fused"].toBool();
    const int64_t B = q.size(0), nh = q.size(1), S = q.size(2), d = q.size(3);
    const int64_t nkv = k0.size(1), g = nh / nkv, steps = kd.size(3);
    const auto acc = acc_dtype(q);
    at::Tensor grad = grads[0].contiguous();
    at::Tensor k0e = expand_kv(k0, g), v0e = expand_kv(v0, g);
    // One kernel backward per forward call, each over its positions [s0, s0 + L).
    const std::vector<int64_t> spans = docs.empty() ? std::vector<int64_t>{S} : docs;
    std::vector<at::Tensor> dqs, dks, dvs;
    int64_t s0 = 0;
    for (size_t c = 0; c < spans.size(); ++c) {
      const int64_t L = spans[c];
      const at::Tensor* part = &saved[7 + 5 * c];
      at::Tensor lse = part[0];
      if (merged) {
        lse = lse.clone();
        lse.narrow(-1, 0, L).copy_(total_lse.narrow(-1, s0, L));
      }
      const bool whole = docs.empty();
      const auto cut = [&](const at::Tensor& t) {
        return whole ? t : t.narrow(2, s0, L).contiguous();
      };
      at::Tensor dq_c, dk_c, dv_c;
      std::tie(dq_c, dk_c, dv_c) =
          causal_backward(kernel, cut(grad), cut(q), cut(k0e), cut(v0e), cut(out), lse, part[1],
                          part[2], part[3], part[4], scale);
      dqs.push_back(dq_c);
      dks.push_back(dk_c);
      dvs.push_back(dv_c);
      s0 += L;
    }
    at::Tensor dq = dqs.size() == 1 ? dqs[0] : at::cat(dqs, 2);
    at::Tensor dk0e = dks.size() == 1 ? dks[0] : at::cat(dks, 2);
    at::Tensor dv0e = dvs.size() == 1 ? dvs[0] : at::cat(dvs, 2);
    at::Tensor dkd, dvd;
    if (fused) {
      kernels::MergeGrads m =
          kernels::ttt_merge_backward(q, grad, out, total_lse, kd, vd, dq, scale);
      dq = std::move(m.dq);
      dkd = std::move(m.dkd);
      dvd = std::move(m.dvd);
    } else if (steps > 0) {
      at::Tensor q5 = q.to(acc).reshape({B, nkv, g, S, d});
      at::Tensor go5 = grad.to(acc).reshape({B, nkv, g, S, d});
      at::Tensor kda = kd.to(acc), vda = vd.to(acc);
      at::Tensor total = total_lse.to(acc).reshape({B, nkv, g, S});
      at::Tensor pd = (diagonal_scores(q5, kda, scale) - total.unsqueeze(-1)).exp();
      at::Tensor D = (go5 * out.to(acc).reshape({B, nkv, g, S, d})).sum(-1, true);  // [..,S,1]
      at::Tensor dp = at::einsum("bkgsd,bksjd->bkgsj", {go5, vda});
      at::Tensor ds = pd * (dp - D);
      at::Tensor dq_diag = at::einsum("bkgsj,bksjd->bkgsd", {ds, kda}) * scale;
      dq = (dq.to(acc) + dq_diag.reshape({B, nh, S, d})).to(q.scalar_type());
      dkd = (at::einsum("bkgsj,bkgsd->bksjd", {ds, q5}) * scale).to(kd.scalar_type());
      dvd = at::einsum("bkgsj,bkgsd->bksjd", {pd, go5}).to(vd.scalar_type());
    }
    return {dq,           reduce_kv(dk0e, g), reduce_kv(dv0e, g), dkd,         dvd,
            at::Tensor(), at::Tensor(),       at::Tensor(),       at::Tensor()};
  }
};

void check_inputs(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                  const std::vector<at::Tensor>& values, const at::Tensor& mask) {
  FSDP_CHECK(q.dim() == 4, fsdp::str("ttt_attention: q must be [B, nh, S, d], got ", q.sizes()),
             "pass heads before the sequence dimension");
  FSDP_CHECK(!keys.empty() && keys.size() == values.size(),
             fsdp::str("ttt_attention: need one key and value tensor per step (keys ", keys.size(),
                       ", values ", values.size(), ")"),
             "step 0's keys are always present");
  const int64_t B = q.size(0), nh = q.size(1), S = q.size(2), d = q.size(3);
  for (size_t j = 0; j < keys.size(); ++j) {
    for (const at::Tensor* t : {&keys[j], &values[j]}) {
      FSDP_CHECK(t->dim() == 4 && t->size(0) == B && t->size(2) == S && t->size(3) == d &&
                     t->size(1) > 0 && nh % t->size(1) == 0 && t->size(1) == keys[0].size(1),
                 fsdp::str("ttt_attention: step ", j, " key/value shape ", t->sizes(),
                           " does not fit q ", q.sizes()),
                 "keys/values are [B, nkv, S, d] with nkv dividing nh");
    }
  }
  FSDP_CHECK(mask.dim() == 2 && mask.size(0) == B && mask.size(1) == S,
             fsdp::str("ttt_attention: attention_mask must be [B, S] = [", B, ", ", S, "], got ",
                       mask.sizes()),
             "pass the batch's attention_mask");
}

at::Tensor row_mask(const at::Tensor& mask, c10::ScalarType dtype) {
  return mask.to(dtype).view({mask.size(0), 1, mask.size(1), 1});
}

}  // namespace

void check_layout(const SeqLayout& layout, int64_t batch, int64_t seq) {
  if (!layout.packed()) return;
  int64_t sum = 0;
  bool positive = true;
  for (const int64_t L : layout.documents) {
    positive = positive && L >= 1;
    sum += L;
  }
  FSDP_CHECK(batch == 1 && positive && sum == seq,
             fsdp::str("a packed micro-batch is one row of whole documents: got [", batch, ", ",
                       seq, "] with ", layout.documents.size(), " documents of ", sum,
                       " tokens in all", positive ? "" : " (one of length < 1)"),
             "pack documents back to back into one row (data::collate_packed)");
}

at::Tensor ttt_attention_efficient(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                                   const std::vector<at::Tensor>& values, const SeqLayout& layout,
                                   double scale, bool fused_merge) {
  const at::Tensor& attention_mask = layout.attention_mask;
  check_inputs(q, keys, values, attention_mask);
  check_layout(layout, q.size(0), q.size(2));
  const Kernel kernel = pick_kernel(q);
  if (kernel == Kernel::kNone) {
    static bool warned = false;
    if (!warned) {
      warned = true;
      FSDP_LOG0(kWarn) << "ttt_attention: no fused attention kernel for " << q.scalar_type()
                       << " on " << q.device() << "; using the dense reference (slow)";
    }
    return ttt_attention_dense(q, keys, values, layout, scale);
  }
  const int64_t B = q.size(0), S = q.size(2), d = q.size(3), nkv = keys[0].size(1);
  at::Tensor kd, vd;
  if (keys.size() > 1) {
    std::vector<at::Tensor> ks(keys.begin() + 1, keys.end()), vs(values.begin() + 1, values.end());
    kd = at::stack(ks, 3);  // [B, nkv, S, i, d]
    vd = at::stack(vs, 3);
  } else {
    kd = at::zeros({B, nkv, S, 0, d}, keys[0].options());
    vd = at::zeros({B, nkv, S, 0, d}, values[0].options());
  }
  // One document is the unpacked call.
  std::vector<int64_t> docs =
      layout.documents.size() > 1 ? layout.documents : std::vector<int64_t>{};
  at::Tensor out =
      TttAttentionFn::apply(q.contiguous(), keys[0].contiguous(), values[0].contiguous(), kd, vd,
                            scale, static_cast<int64_t>(kernel), std::move(docs), fused_merge);
  return out * row_mask(attention_mask, out.scalar_type());
}

at::Tensor ttt_attention_dense(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                               const std::vector<at::Tensor>& values, const SeqLayout& layout,
                               double scale) {
  const at::Tensor& attention_mask = layout.attention_mask;
  check_inputs(q, keys, values, attention_mask);
  check_layout(layout, q.size(0), q.size(2));
  const int64_t S = q.size(2), nh = q.size(1), g = nh / keys[0].size(1);
  const int64_t steps = static_cast<int64_t>(keys.size());
  const auto acc = acc_dtype(q);
  at::Tensor K = expand_kv(at::cat(keys, 2), g).to(acc);  // [B, nh, steps*S, d]
  at::Tensor V = expand_kv(at::cat(values, 2), g).to(acc);
  at::Tensor scores = at::matmul(q.to(acc), K.transpose(-1, -2)) * scale;  // [B,nh,S,steps*S]
  // Allowed keys: step-0 block causal and valid (and, packed, of the query's document), step-j
  // blocks only the same position. Rows past the valid length keep the causal block only
  // (their output is zeroed) so no row is empty and no NaN can reach the gradient.
  auto opts = at::TensorOptions().device(q.device()).dtype(at::kBool);
  at::Tensor pos = at::arange(S, opts.dtype(at::kLong));
  at::Tensor causal = pos.view({1, S}) <= pos.view({S, 1});  // [t, key]
  if (layout.packed()) {
    std::vector<int64_t> doc_of(static_cast<size_t>(S));
    int64_t t = 0;
    for (size_t k = 0; k < layout.documents.size(); ++k)
      for (int64_t j = 0; j < layout.documents[k]; ++j)
        doc_of[static_cast<size_t>(t++)] = static_cast<int64_t>(k);
    at::Tensor doc = at::tensor(doc_of, at::kLong).to(q.device());
    causal = causal & (doc.view({1, S}) == doc.view({S, 1}));
  }
  at::Tensor valid = attention_mask.to(at::kBool);  // [B, S]
  at::Tensor row_valid = valid.view({-1, 1, S, 1});
  at::Tensor block0 =
      causal.view({1, 1, S, S}) & (valid.view({-1, 1, 1, S}) | row_valid.logical_not());
  std::vector<at::Tensor> blocks{block0.expand({valid.size(0), 1, S, S})};
  at::Tensor eye = at::eye(S, opts).view({1, 1, S, S}).expand({valid.size(0), 1, S, S});
  for (int64_t j = 1; j < steps; ++j) blocks.push_back(eye);
  at::Tensor allowed = at::cat(blocks, -1);  // [B,1,S,steps*S]
  at::Tensor p = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity())
                     .softmax(-1);
  at::Tensor out = at::matmul(p, V).to(q.scalar_type());
  return out * row_mask(attention_mask, out.scalar_type());
}

at::Tensor ttt_attention(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                         const std::vector<at::Tensor>& values, const SeqLayout& layout,
                         double scale, AttentionImpl impl) {
  return impl == AttentionImpl::kDense ? ttt_attention_dense(q, keys, values, layout, scale)
                                       : ttt_attention_efficient(q, keys, values, layout, scale,
                                                                 impl == AttentionImpl::kFused);
}

void check_right_padded(const at::Tensor& attention_mask, const char* what) {
  FSDP_USAGE_CHECK(attention_mask.dim() == 2,
                   fsdp::str(what, " must be [B, S], got ", attention_mask.sizes()),
                   "pass one mask row per sample");
  at::Tensor m = attention_mask.to(at::kCPU).to(at::kLong);
  const bool binary = m.eq(0).logical_or(m.eq(1)).all().item<bool>();
  FSDP_USAGE_CHECK(binary, fsdp::str(what, " must contain only 0 and 1"),
                   "masks are 0/1 per token");
  if (m.size(1) > 1) {
    const bool rises =
        (m.narrow(1, 1, m.size(1) - 1) > m.narrow(1, 0, m.size(1) - 1)).any().item<bool>();
    FSDP_USAGE_CHECK(!rises, fsdp::str(what, " is not right-padded (a 0 is followed by a 1)"),
                     "collate samples as ones followed by zero padding (docs/reference.md §1.3), "
                     "or use the dense "
                     "attention");
  }
}

}  // namespace fsdp::model
