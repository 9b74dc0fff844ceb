// Fused AdamW kernel over flat fp32 pieces (see adamw.h). The CPU loop mirrors the per-element
// order of torch's single-tensor AdamW so results agree to rounding; it must never allocate.
#include "optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"

namespace fsdp::optim {

void AdamWOptions::validate() const {
  FSDP_USAGE_CHECK(beta1 >= 0.0 && beta1 < 1.0, str("adam beta1 ", beta1, " is not in [0, 1)"),
                   "set --adam-beta1 to a value such as 0.9");
  FSDP_USAGE_CHECK(beta2 >= 0.0 && beta2 < 1.0, str("adam beta2 ", beta2, " is not in [0, 1)"),
                   "set --adam-beta2 to a value such as 0.999");
  FSDP_USAGE_CHECK(eps > 0.0, str("adam eps ", eps, " must be positive"),
                   "set --adam-eps to a value such as 1e-8");
  FSDP_USAGE_CHECK(weight_decay >= 0.0, str("weight decay ", weight_decay, " is negative"),
                   "set --weight-decay to 0 or a positive value");
  FSDP_USAGE_CHECK(decay_min_dim >= 0, str("decay_min_dim ", decay_min_dim, " is negative"),
                   "use 2 to exclude 1-D parameters from weight decay, 0 to decay all");
}

bool decays(const AdamWOptions& options, int64_t dim) {
  return dim >= options.decay_min_dim;
}

void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const AdamWOptions& o, double weight_decay,
                  const AdamWStep& s) {
  const int64_t n = param.numel();
  FSDP_ASSERT(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n,
              "adamw_update: numel mismatch");
  FSDP_ASSERT(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat &&
                  exp_avg.scalar_type() == at::kFloat && exp_avg_sq.scalar_type() == at::kFloat,
              "adamw_update: tensors must be fp32");
  if (n == 0) return;
  // Scalars are formed in double as Python does, then used at fp32 like torch's CPU kernels.
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(s.step));
  const double step_size = s.lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  const float decay = static_cast<float>(1.0 - s.lr * weight_decay);
  const float w1 = static_cast<float>(1.0 - o.beta1);
  const float b2 = static_cast<float>(o.beta2);
  const float w2 = static_cast<float>(1.0 - o.beta2);
  const float eps = static_cast<float>(o.eps);
  const float scale = static_cast<float>(s.grad_scale);
  const float neg_step = static_cast<float>(-step_size);
  const float bc2s = static_cast<float>(bc2_sqrt);

  if (param.device().is_cpu()) {
    FSDP_ASSERT(param.is_contiguous() && grad.is_contiguous() && exp_avg.is_contiguous() &&
                    exp_avg_sq.is_contiguous(),
                "adamw_update: tensors must be contiguous");
    float* p = param.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    float* m = exp_avg.data_ptr<float>();
    float* v = exp_avg_sq.data_ptr<float>();
    at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float gi = g[i] * scale;
        float pi = p[i] * decay;
        // torch lerp with weight < 0.5: self + weight * (end - self)
        const float mi = m[i] + w1 * (gi - m[i]);
        const float vi = v[i] * b2 + w2 * (gi * gi);
        const float denom = std::sqrt(vi) / bc2s + eps;
        pi = pi + neg_step * (mi / denom);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
      }
    });
    return;
  }
  // GPU and other devices: the same arithmetic as tensor operations (torch's foreach path).
  at::Tensor g = s.grad_scale == 1.0 ? grad : grad * s.grad_scale;
  if (weight_decay != 0.0) param.mul_(1.0 - s.lr * weight_decay);
  exp_avg.lerp_(g, 1.0 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  at::Tensor denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(o.eps);
  param.addcdiv_(exp_avg, denom, -step_size);
}

int host_loop_threads() {
  std::mutex mu;
  std::set<std::thread::id> seen;
  const int64_t n = at::get_num_threads();
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    // Hold each chunk briefly so one thread cannot take every chunk before the others start.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
  });
  return static_cast<int>(seen.size());
}

namespace {

// torch's fused multi-tensor kernel over every piece: one launch per weight-decay value. `step`
// (fp32 0-dim, the 1-based count the update uses) is read, not incremented, by the kernel;
// grad_scale divides the gradient (AMP's unscale); found_inf = 1 leaves everything untouched.
void fused_adamw(const std::vector<AdamWPiece>& pieces, const AdamWOptions& o, double lr,
                 const at::Tensor& step, const std::optional<at::Tensor>& grad_scale,
                 const std::optional<at::Tensor>& found_inf) {
  const c10::Device device = pieces.front().param.device();
  std::map<double, std::vector<const AdamWPiece*>> by_decay;
  for (const AdamWPiece& p : pieces) {
    FSDP_ASSERT(p.param.device() == device && p.param.scalar_type() == at::kFloat &&
                    p.grad.scalar_type() == at::kFloat && p.param.numel() == p.grad.numel(),
                "fused AdamW: pieces must be fp32 on one device");
    if (p.param.numel() > 0) by_decay[p.weight_decay].push_back(&p);
  }
  for (const auto& [decay, group] : by_decay) {
    std::vector<at::Tensor> params, grads, avgs, avg_sqs, steps;
    for (const AdamWPiece* p : group) {
      params.push_back(p->param);
      grads.push_back(p->grad);
      avgs.push_back(p->exp_avg);
      avg_sqs.push_back(p->exp_avg_sq);
      steps.push_back(step);
    }
    at::_fused_adamw_(params, grads, avgs, avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, o.beta1,
                      o.beta2, decay, o.eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale,
                      found_inf);
  }
}

}  // namespace

void adamw_update_all(const std::vector<AdamWPiece>& pieces, const AdamWOptions& o,
                      const AdamWStep& s, AdamWImpl impl) {
  if (pieces.empty()) return;
  const bool fused = impl == AdamWImpl::kFused ||
                     (impl == AdamWImpl::kAuto && !pieces.front().param.device().is_cpu());
  if (!fused) {
    for (const AdamWPiece& p : pieces) {
      adamw_update(p.param, p.grad, p.exp_avg, p.exp_avg_sq, o, p.weight_decay, s);
    }
    return;
  }
  const auto scalar = [&](double x) {
    return at::full({}, x, pieces.front().param.options().dtype(at::kFloat));
  };
  // The kernel divides the gradient by grad_scale: pass 1/clip coefficient.
  std::optional<at::Tensor> grad_scale;
  if (s.grad_scale != 1.0) grad_scale = scalar(1.0 / s.grad_scale);
  fused_adamw(pieces, o, s.lr, scalar(static_cast<double>(s.step)), grad_scale, std::nullopt);
}

void adamw_update_all_device(const std::vector<AdamWPiece>& pieces, const AdamWOptions& o,
                             const AdamWDeviceStep& s) {
  if (pieces.empty()) return;
  const c10::Device device = pieces.front().param.device();
  FSDP_ASSERT(s.step.defined() && s.clip.defined() && s.found_inf.defined() &&
                  s.step.device() == device && s.clip.device() == device &&
                  s.found_inf.device() == device,
              "adamw_update_all_device: step, clip and found_inf must be on the pieces' device");
  // 1/clip computed in double and rounded to fp32, as the host path does.
  fused_adamw(pieces, o, s.lr, s.step, s.clip.reciprocal().to(at::kFloat),
              s.found_inf.to(at::kFloat));
}

}  // namespace fsdp::optim
