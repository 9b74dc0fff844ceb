// linear_grad_in_place (model/linear_grad.h): a custom autograd function over (x, W).
#include "model/linear_grad.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>

namespace fsdp::model {
namespace {

std::atomic<int64_t> in_place_adds{0};

struct LinearGradInPlace : torch::autograd::Function<LinearGradInPlace> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const c10::intrusive_ptr<LinearUses>& uses) {
    ++uses->uses;
    ctx->save_for_backward({x, weight});
    ctx->saved_data["uses"] = c10::IValue::make_capsule(uses);
    return at::linear(x, weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto uses = c10::static_intrusive_pointer_cast<LinearUses>(ctx->saved_data["uses"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor& dy = grads[0];
    torch::autograd::variable_list out(3);
    if (!dy.defined()) return out;
    if (ctx->needs_input_grad(0)) out[0] = at::matmul(dy, w);
    if (!ctx->needs_input_grad(1)) return out;
    const bool last = ++uses->done >= uses->uses;
    const at::Tensor dy2 = dy.reshape({-1, dy.size(-1)}), x2 = x.reshape({-1, x.size(-1)});
    at::Tensor g = uses->weight.grad();
    if (!last && g.defined() && g.sizes() == w.sizes() && g.scalar_type() == w.scalar_type() &&
        g.device() == w.device()) {
      // The weight-gradient GEMM accumulates into .grad itself (beta = 1).
      g.addmm_(dy2.t(), x2);
      in_place_adds.fetch_add(1, std::memory_order_relaxed);
    } else {
      out[1] = dy2.t().mm(x2);
    }
    return out;
  }
};

}  // namespace

at::Tensor linear_grad_in_place(const at::Tensor& x, const c10::intrusive_ptr<LinearUses>& uses) {
  return LinearGradInPlace::apply(x, uses->weight, uses);
}

int64_t linear_grad_in_place_adds() {
  return in_place_adds.load(std::memory_order_relaxed);
}

}  // namespace fsdp::model
