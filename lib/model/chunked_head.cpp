// The draft's norm and lm_head over row chunks (Eagle3DraftImpl::head_rows, docs/model.md
// "Chunked head and loss"): backward recomputes each chunk's logits instead of keeping them.
// Model code only: the sharding engine sees one use of each head unit, through the hooks.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/draft_model.h"

namespace fsdp::model {
namespace {

// What the chunked head needs besides its tensor inputs; held by the autograd node (a capsule
// in its saved data) until backward. The modules are held, not their weights: backward reads
// the live (re-gathered) parameters, as CheckpointedLayer does.
struct HeadCall : torch::CustomClassHolder {
  std::shared_ptr<RMSNormImpl> norm;  // null with norm_output (x is normed already)
  std::shared_ptr<torch::nn::LinearImpl> lm_head;
  Eagle3DraftImpl::HeadFns fns;
  int64_t chunk = 1;

  at::Tensor logits(const at::Tensor& x) const {
    return lm_head->forward(norm ? norm->forward(x) : x);
  }
  int64_t chunks(int64_t rows) const { return std::max<int64_t>(1, (rows + chunk - 1) / chunk); }
};

// Inputs: x [N, H], then the norm's weight (unless norm_output) and lm_head's weight, so that
// autograd routes their gradients to each parameter's AccumulateGrad (once per backward, all
// steps' contributions summed: the sharding engine's gradient-ready hooks rely on that).
// Output: the values [k, N]. Forward keeps only x; backward reruns each chunk with a graph and
// takes its gradients with autograd::grad.
struct ChunkedHead : torch::autograd::Function<ChunkedHead> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                const c10::intrusive_ptr<HeadCall>& call) {
    const at::Tensor& x = inputs[0];
    const int64_t n = x.size(0);
    std::vector<at::Tensor> values;
    for (int64_t c = 0; c < call->chunks(n); ++c) {
      const int64_t from = c * call->chunk, len = std::min(call->chunk, n - from);
      const at::Tensor z = call->logits(x.narrow(0, from, len));
      values.push_back(call->fns.values(z, from));
      if (call->fns.inspect) call->fns.inspect(z, from);
    }
    call->fns.inspect = nullptr;  // it may refer to the caller's locals; backward never inspects
    ctx->save_for_backward({x});
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return {at::cat(values, 1)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call = c10::static_intrusive_pointer_cast<HeadCall>(ctx->saved_data["call"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0];
    std::vector<at::Tensor> weights;
    if (call->norm) weights.push_back(call->norm->weight);
    weights.push_back(call->lm_head->weight);
    const bool want_x = ctx->needs_input_grad(0);
    at::Tensor grad_x = want_x ? at::empty_like(x) : at::Tensor();
    // Each chunk's weight gradient is summed in fp32 (fp64 for double weights), rounded once.
    std::vector<at::Tensor> grad_w(weights.size());
    for (size_t j = 0; j < weights.size(); ++j) {
      if (!ctx->needs_input_grad(1 + j)) continue;
      const auto wide = weights[j].scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      grad_w[j] = at::zeros(weights[j].sizes(), weights[j].options().dtype(wide));
    }
    const int64_t n = x.size(0);
    for (int64_t c = 0; c < call->chunks(n); ++c) {
      const int64_t from = c * call->chunk, len = std::min(call->chunk, n - from);
      at::Tensor leaf = x.narrow(0, from, len).detach();
      std::vector<at::Tensor> wrt;
      if (want_x) wrt.push_back(leaf.requires_grad_(true));
      for (size_t j = 0; j < weights.size(); ++j)
        if (grad_w[j].defined()) wrt.push_back(weights[j]);
      at::Tensor v;
      {
        at::AutoGradMode enable(true);
        v = call->fns.values(call->logits(leaf), from);
      }
      const torch::autograd::variable_list g =
          torch::autograd::grad({v}, wrt, {grads[0].narrow(1, from, len)}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
      size_t k = 0;
      if (want_x) {
        const at::Tensor& gx = g[k++];
        if (gx.defined()) {
          grad_x.narrow(0, from, len).copy_(gx);
        } else {
          grad_x.narrow(0, from, len).zero_();
        }
      }
      for (auto& gw : grad_w) {
        if (!gw.defined()) continue;
        const at::Tensor& part = g[k++];
        if (part.defined()) gw.add_(part);
      }
    }
    torch::autograd::variable_list result(1 + weights.size() + 1);  // + the HeadCall argument
    result[0] = grad_x;
    for (size_t j = 0; j < weights.size(); ++j)
      if (grad_w[j].defined()) result[1 + j] = grad_w[j].to(weights[j].scalar_type());
    return result;
  }
};

}  // namespace

at::Tensor Eagle3DraftImpl::head_rows(const at::Tensor& x, int64_t chunk_rows, const HeadFns& fns) {
  FSDP_CHECK(chunk_rows >= 1, fsdp::str("head chunk of ", chunk_rows, " rows"),
             "give --head-chunk-rows a positive number of rows, 0 (automatic) or -1 (off)");
  auto call = c10::make_intrusive<HeadCall>();
  if (!cfg_.norm_output) call->norm = norm.ptr();
  call->lm_head = lm_head.ptr();
  call->fns = fns;
  call->chunk = chunk_rows;
  std::vector<at::Tensor> inputs{x};
  if (call->norm) inputs.push_back(norm->weight);
  inputs.push_back(lm_head->weight);
  const bool graph = at::GradMode::is_enabled() && fns.values &&
                     std::any_of(inputs.begin(), inputs.end(),
                                 [](const at::Tensor& t) { return t.requires_grad(); });
  // One use of each unit around all chunks, lm_head's inside the norm's: both stay gathered
  // while the chunks run, and the hooks see the order of logits().
  if (hooks_ && call->norm) hooks_->pre_forward("norm");
  if (hooks_) hooks_->pre_forward("lm_head");
  at::Tensor out;
  if (graph) {
    out = ChunkedHead::apply(at::TensorList(inputs), call)[0];
  } else {
    at::NoGradGuard guard;
    std::vector<at::Tensor> values;
    const int64_t n = x.size(0);
    for (int64_t c = 0; c < call->chunks(n); ++c) {
      const int64_t from = c * chunk_rows, len = std::min(chunk_rows, n - from);
      const at::Tensor z = call->logits(x.narrow(0, from, len));
      if (fns.values) values.push_back(fns.values(z, from));
      if (fns.inspect) fns.inspect(z, from);
    }
    if (!values.empty()) out = at::cat(values, 1);
  }
  if (hooks_) hooks_->post_forward("lm_head", out);
  if (hooks_ && call->norm) hooks_->post_forward("norm", out);
  return out;
}

}  // namespace fsdp::model
