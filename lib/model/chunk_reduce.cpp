// Chunked, recomputing reduction of additive objective terms (model/chunk_reduce.h).
#include "model/chunk_reduce.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <algorithm>

#include "core/error.h"

namespace fsdp::model {
namespace {

struct ReduceCall : torch::CustomClassHolder {
  ChunkTermsFn fn;
  int64_t chunk = 1, dim = 0, length = 0, num_sliced = 0;
  std::vector<at::Tensor> sliced;  // the non-differentiable sliced inputs (index >= 1)

  int64_t chunks() const { return (length + chunk - 1) / chunk; }
  std::vector<at::Tensor> slices(const at::Tensor& first, int64_t c) const {
    const int64_t from = c * chunk, len = std::min(chunk, length - from);
    std::vector<at::Tensor> out{first.narrow(dim, from, len)};
    for (const auto& t : sliced) out.push_back(t.defined() ? t.narrow(dim, from, len) : t);
    return out;
  }
  at::Tensor terms(const std::vector<at::Tensor>& s, const std::vector<at::Tensor>& params) const {
    return at::stack(fn(s, params));
  }
};

// Inputs: the first sliced tensor, then the params; output: the summed terms [T].
struct ChunkReduce : torch::autograd::Function<ChunkReduce> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                const c10::intrusive_ptr<ReduceCall>& call) {
    const at::Tensor& first = inputs[0];
    const std::vector<at::Tensor> params(inputs.begin() + 1, inputs.end());
    at::Tensor total;
    for (int64_t c = 0; c < call->chunks(); ++c) {
      at::Tensor t = call->terms(call->slices(first, c), params);
      total = total.defined() ? total + t : t;
    }
    ctx->save_for_backward({first});
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->saved_data["params"] = c10::IValue(c10::List<at::Tensor>(params));
    return {total};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call = c10::static_intrusive_pointer_cast<ReduceCall>(ctx->saved_data["call"].toCapsule());
    const at::Tensor first = ctx->get_saved_variables()[0];
    const auto plist = ctx->saved_data["params"].toTensorList();
    std::vector<at::Tensor> params(plist.begin(), plist.end());
    const bool want_first = ctx->needs_input_grad(0);
    at::Tensor grad_first = want_first ? at::zeros_like(first) : at::Tensor();
    std::vector<at::Tensor> grad_p(params.size());
    for (int64_t c = 0; c < call->chunks(); ++c) {
      const int64_t from = c * call->chunk, len = std::min(call->chunk, call->length - from);
      std::vector<at::Tensor> s = call->slices(first, c);
      s[0] = s[0].detach().requires_grad_(want_first);
      std::vector<at::Tensor> wrt;
      if (want_first) wrt.push_back(s[0]);
      for (size_t j = 0; j < params.size(); ++j)
        if (ctx->needs_input_grad(1 + j)) wrt.push_back(params[j]);
      at::Tensor t;
      {
        at::AutoGradMode enable(true);
        t = call->terms(s, params);
      }
      if (!t.requires_grad() || wrt.empty()) continue;
      const auto g = torch::autograd::grad({t}, wrt, {grads[0]}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
      size_t k = 0;
      if (want_first) {
        if (g[k].defined()) grad_first.narrow(call->dim, from, len).copy_(g[k]);
        ++k;
      }
      for (size_t j = 0; j < params.size(); ++j) {
        if (!ctx->needs_input_grad(1 + j)) continue;
        if (g[k].defined()) grad_p[j] = grad_p[j].defined() ? grad_p[j] + g[k] : g[k];
        ++k;
      }
    }
    torch::autograd::variable_list result(1 + params.size() + 1);
    result[0] = grad_first;
    for (size_t j = 0; j < params.size(); ++j) result[1 + j] = grad_p[j];
    return result;
  }
};

}  // namespace

at::Tensor chunk_reduce(const ChunkTermsFn& fn, const std::vector<at::Tensor>& sliced,
                        const std::vector<at::Tensor>& params, int64_t chunk, int64_t dim) {
  FSDP_CHECK(!sliced.empty() && sliced[0].defined() && chunk >= 0,
             "chunk_reduce: needs a first input and a chunk size >= 0",
             "this is a bug in fsdp-train: please report it");
  const int64_t length = sliced[0].size(dim);
  for (const auto& t : sliced)
    FSDP_CHECK(!t.defined() || t.size(dim) == length, "chunk_reduce: inputs are not aligned",
               "this is a bug in fsdp-train: please report it");
  const bool graph = at::GradMode::is_enabled() &&
                     (sliced[0].requires_grad() ||
                      std::any_of(params.begin(), params.end(),
                                  [](const at::Tensor& p) { return p.requires_grad(); }));
  if (chunk == 0 || chunk >= length || !graph) {
    // One pass (or a pass per chunk without a graph: nothing to keep).
    const int64_t step = (chunk == 0 || chunk >= length) ? length : chunk;
    at::Tensor total;
    for (int64_t from = 0; from < length; from += step) {
      const int64_t len = std::min(step, length - from);
      std::vector<at::Tensor> s;
      for (const auto& t : sliced) s.push_back(t.defined() ? t.narrow(dim, from, len) : t);
      at::Tensor t = at::stack(fn(s, params));
      total = total.defined() ? total + t : t;
    }
    return total;
  }
  auto call = c10::make_intrusive<ReduceCall>();
  call->fn = fn;
  call->chunk = chunk;
  call->dim = dim;
  call->length = length;
  call->sliced.assign(sliced.begin() + 1, sliced.end());
  std::vector<at::Tensor> inputs{sliced[0]};
  inputs.insert(inputs.end(), params.begin(), params.end());
  return ChunkReduce::apply(at::TensorList(inputs), call)[0];
}

}  // namespace fsdp::model
