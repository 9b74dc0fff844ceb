// Checks and launches for kernels/fused.h. The one file that knows whether the CUDA kernels are
// compiled in (FSDP_HAVE_CUDA_KERNELS); without them every entry point reports it.
#include "kernels/fused.h"

#include <ATen/ATen.h>

#include "core/error.h"

#ifndef FSDP_HAVE_CUDA_KERNELS
#define FSDP_HAVE_CUDA_KERNELS 0
#endif

#if FSDP_HAVE_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/launch.h"
#endif

namespace fsdp::kernels {
namespace {

bool float_type(c10::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

#if FSDP_HAVE_CUDA_KERNELS
launch::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return launch::Dtype::kFloat32;
    case at::kBFloat16:
      return launch::Dtype::kBFloat16;
    case at::kHalf:
      return launch::Dtype::kFloat16;
    default:
      break;
  }
  FSDP_FAIL(fsdp::str("fused CUDA kernels: unsupported dtype ", t.scalar_type()),
            "use fp32, bf16 or fp16 tensors");
}

launch::Strides strides_of(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2)};
}

// A [B, heads, S, d] tensor whose last dimension is contiguous (a copy when it is not).
at::Tensor rows_contiguous(const at::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

void check_launch(const char* err, const char* what) {
  FSDP_CHECK(err == nullptr, fsdp::str(what, ": CUDA error: ", err ? err : ""),
             "rerun with --fused-cuda-kernels false to use the composite ops, and report it");
}

void* stream() {
  return at::cuda::getCurrentCUDAStream().stream();
}
#endif

void require_compiled() {
  FSDP_CHECK(
      compiled(), "this fsdp-train was built without its CUDA kernels",
      "build against a CUDA LibTorch (FSDP_GPU=CUDA) or run with --fused-cuda-kernels false");
}

// The kernels read a row's elements at unit stride; a single column's stride is never used
// (LibTorch gives [n, 1] results of elementwise ops a column stride of 0).
bool unit_column_stride(const at::Tensor& t) {
  return t.size(1) == 1 || t.stride(1) == 1;
}

}  // namespace

bool compiled() {
  return FSDP_HAVE_CUDA_KERNELS != 0;
}

bool soft_ce_supported(const at::Tensor& logits, const at::Tensor& target_p) {
  return compiled() && logits.defined() && target_p.defined() && logits.is_cuda() &&
         target_p.device() == logits.device() && logits.dim() == 2 && target_p.dim() == 2 &&
         logits.size(1) == target_p.size(1) && float_type(logits.scalar_type()) &&
         float_type(target_p.scalar_type()) && unit_column_stride(logits) &&
         unit_column_stride(target_p);
}

SoftCe soft_ce_forward(const at::Tensor& logits, const at::Tensor& target_p,
                       const at::Tensor& take) {
  require_compiled();
  FSDP_CHECK(soft_ce_supported(logits, target_p),
             fsdp::str("soft_ce_forward: logits ", logits.sizes(), " ", logits.scalar_type(),
                       " on ", logits.device(), " and target ", target_p.sizes(), " ",
                       target_p.scalar_type(), " do not fit the kernel"),
             "check soft_ce_supported() first");
  FSDP_CHECK(take.scalar_type() == at::kLong && take.dim() == 1 && take.size(0) == logits.size(0) &&
                 take.device() == logits.device(),
             fsdp::str("soft_ce_forward: take must be int64 [", logits.size(0), "] on ",
                       logits.device(), ", got ", take.sizes(), " ", take.scalar_type()),
             "pass the loss rows' indices into target_p");
  SoftCe r;
#if FSDP_HAVE_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor idx = take.contiguous();
  const int64_t n = logits.size(0), V = logits.size(1);
  auto f32 = logits.options().dtype(at::kFloat);
  r.loss = at::empty({n}, f32);
  r.row_max = at::empty({n}, f32);
  r.log_sum = at::empty({n}, f32);
  r.psum = at::empty({n}, f32);
  check_launch(launch::soft_ce_forward(dtype_of(logits), logits.data_ptr(), logits.stride(0),
                                       dtype_of(target_p), target_p.data_ptr(), target_p.stride(0),
                                       idx.data_ptr<int64_t>(), n, V, r.loss.data_ptr<float>(),
                                       r.row_max.data_ptr<float>(), r.log_sum.data_ptr<float>(),
                                       r.psum.data_ptr<float>(), stream()),
               "soft_ce_forward");
#endif
  return r;
}

at::Tensor soft_ce_backward(const at::Tensor& grad, const at::Tensor& logits,
                            const at::Tensor& target_p, const at::Tensor& take,
                            const at::Tensor& row_max, const at::Tensor& log_sum,
                            const at::Tensor& psum) {
  require_compiled();
  const int64_t n = logits.size(0);
  FSDP_CHECK(soft_ce_supported(logits, target_p) && take.numel() == n && grad.numel() == n &&
                 row_max.numel() == n && log_sum.numel() == n && psum.numel() == n,
             fsdp::str("soft_ce_backward: grad ", grad.sizes(), ", logits ", logits.sizes(),
                       ", take ", take.sizes(), ", row_max ", row_max.sizes(), " do not fit"),
             "pass soft_ce_forward's row_max, log_sum and psum with the same logits and rows");
  at::Tensor out =
      at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
#if FSDP_HAVE_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor g = grad.to(at::kFloat).contiguous(), idx = take.contiguous();
  const at::Tensor m = row_max.contiguous(), ls = log_sum.contiguous(), ps = psum.contiguous();
  check_launch(launch::soft_ce_backward(
                   g.data_ptr<float>(), dtype_of(logits), logits.data_ptr(), logits.stride(0),
                   dtype_of(target_p), target_p.data_ptr(), target_p.stride(0),
                   idx.data_ptr<int64_t>(), m.data_ptr<float>(), ls.data_ptr<float>(),
                   ps.data_ptr<float>(), n, logits.size(1), out.data_ptr(), stream()),
               "soft_ce_backward");
#endif
  return out;
}

bool ttt_merge_supported(const at::Tensor& q, int64_t steps) {
#if FSDP_HAVE_CUDA_KERNELS
  return q.defined() && q.is_cuda() && q.dim() == 4 && float_type(q.scalar_type()) &&
         q.size(3) <= launch::kMergeMaxHeadDim && steps >= 1 &&
         launch::kMergeWarpsPerBlock * launch::merge_shared_bytes_per_warp(steps, q.size(3)) <=
             launch::kMergeMaxSharedBytes;
#else
  return false;
#endif
}

namespace {
#if FSDP_HAVE_CUDA_KERNELS
launch::MergeShape merge_shape(const at::Tensor& q, const at::Tensor& kd, const at::Tensor& vd,
                               const char* what) {
  const bool fits = q.dim() == 4 && kd.dim() == 5 && kd.sizes() == vd.sizes() &&
                    kd.size(0) == q.size(0) && kd.size(1) > 0 && q.size(1) % kd.size(1) == 0 &&
                    kd.size(2) == q.size(2) && kd.size(4) == q.size(3) &&
                    kd.scalar_type() == q.scalar_type() && vd.scalar_type() == q.scalar_type() &&
                    kd.device() == q.device() && vd.device() == q.device() &&
                    ttt_merge_supported(q, kd.size(3));
  FSDP_CHECK(
      fits,
      fsdp::str(what, ": q ", q.sizes(), " ", q.scalar_type(), " and diagonal keys ", kd.sizes(),
                " / values ", vd.sizes(), " ", kd.scalar_type(), " do not fit the kernel"),
      "check ttt_merge_supported() first; keys are [B, nkv, S, steps, d]");
  launch::MergeShape sh;
  sh.B = q.size(0);
  sh.nkv = kd.size(1);
  sh.groups = q.size(1) / kd.size(1);
  sh.S = q.size(2);
  sh.steps = kd.size(3);
  sh.d = q.size(3);
  return sh;
}

void check_like_q(const at::Tensor& t, const at::Tensor& q, const char* what, const char* name) {
  FSDP_CHECK(
      t.sizes() == q.sizes() && t.scalar_type() == q.scalar_type() && t.device() == q.device(),
      fsdp::str(what, ": ", name, " ", t.sizes(), " ", t.scalar_type(), " must match q ", q.sizes(),
                " ", q.scalar_type()),
      "pass tensors of the same attention call");
}
#endif
}  // namespace

Merge ttt_merge_forward(const at::Tensor& q, const at::Tensor& causal_out, const at::Tensor& lse_c,
                        const at::Tensor& kd, const at::Tensor& vd, double scale) {
  require_compiled();
  Merge r;
#if FSDP_HAVE_CUDA_KERNELS
  const char* what = "ttt_merge_forward";
  const launch::MergeShape sh = merge_shape(q, kd, vd, what);
  check_like_q(causal_out, q, what, "causal_out");
  const int64_t B = q.size(0), nh = q.size(1), S = q.size(2);
  FSDP_CHECK(lse_c.dim() == 3 && lse_c.size(0) == B && lse_c.size(1) == nh && lse_c.size(2) == S,
             fsdp::str(what, ": lse_c must be [", B, ", ", nh, ", ", S, "], got ", lse_c.sizes()),
             "pass the causal part's log-sum-exp");
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qq = rows_contiguous(q), co = rows_contiguous(causal_out);
  const at::Tensor lse = lse_c.to(at::kFloat).contiguous();
  const at::Tensor k = kd.contiguous(), v = vd.contiguous();
  r.out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  r.total = at::empty({B, nh, S}, q.options().dtype(at::kFloat));
  check_launch(launch::ttt_merge_forward(dtype_of(q), sh, qq.data_ptr(), strides_of(qq),
                                         co.data_ptr(), strides_of(co), lse.data_ptr<float>(),
                                         k.data_ptr(), v.data_ptr(), static_cast<float>(scale),
                                         r.out.data_ptr(), r.total.data_ptr<float>(), stream()),
               what);
#endif
  return r;
}

MergeGrads ttt_merge_backward(const at::Tensor& q, const at::Tensor& grad, const at::Tensor& out,
                              const at::Tensor& total, const at::Tensor& kd, const at::Tensor& vd,
                              const at::Tensor& dq_causal, double scale) {
  require_compiled();
  MergeGrads r;
#if FSDP_HAVE_CUDA_KERNELS
  const char* what = "ttt_merge_backward";
  const launch::MergeShape sh = merge_shape(q, kd, vd, what);
  check_like_q(grad, q, what, "grad");
  check_like_q(out, q, what, "out");
  check_like_q(dq_causal, q, what, "dq_causal");
  FSDP_CHECK(total.numel() == q.size(0) * q.size(1) * q.size(2),
             fsdp::str(what, ": total has ", total.numel(), " entries for q ", q.sizes()),
             "pass ttt_merge_forward's total");
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qq = rows_contiguous(q), g = rows_contiguous(grad), o = rows_contiguous(out),
                   dqc = rows_contiguous(dq_causal);
  const at::Tensor tot = total.to(at::kFloat).contiguous();
  const at::Tensor k = kd.contiguous(), v = vd.contiguous();
  r.dq = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  r.dkd = at::empty(k.sizes(), k.options());
  r.dvd = at::empty(v.sizes(), v.options());
  check_launch(launch::ttt_merge_backward(
                   dtype_of(q), sh, qq.data_ptr(), strides_of(qq), g.data_ptr(), strides_of(g),
                   o.data_ptr(), strides_of(o), tot.data_ptr<float>(), k.data_ptr(), v.data_ptr(),
                   dqc.data_ptr(), strides_of(dqc), static_cast<float>(scale), r.dq.data_ptr(),
                   r.dkd.data_ptr(), r.dvd.data_ptr(), stream()),
               what);
#endif
  return r;
}

}  // namespace fsdp::kernels
