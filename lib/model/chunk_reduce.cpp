// Chunked, recomputing reduction of additive objective terms (model/chunk_reduce.h).
#include "model/chunk_reduce.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"

namespace fsdp::model {
namespace {

// The terms of one call, flattened and concatenated in order.
at::Tensor flat_terms(const std::vector<at::Tensor>& terms) {
  std::vector<at::Tensor> flat;
  for (const auto& t : terms) flat.push_back(t.reshape(-1));
  return at::cat(flat);
}

struct ReduceCall : torch::CustomClassHolder {
  ChunkTermsFn fn;
  int64_t chunk = 1, dim = 0, length = 0, num_sliced = 0;
  std::vector<at::Tensor> sliced;    // the non-differentiable sliced inputs (index >= 1)
  std::vector<double> loss_weights;  // the caller's loss direction (missing entries: 0)

  int64_t chunks() const { return (length + chunk - 1) / chunk; }
  std::vector<at::Tensor> slices(const at::Tensor& first, int64_t c) const {
    const int64_t from = c * chunk, len = std::min(chunk, length - from);
    std::vector<at::Tensor> out{first.narrow(dim, from, len)};
    for (const auto& t : sliced) out.push_back(t.defined() ? t.narrow(dim, from, len) : t);
    return out;
  }
  double weight(size_t i) const { return i < loss_weights.size() ? loss_weights[i] : 0.0; }
};

// The gradients of seed . terms summed over the chunks run: the first input's (a slice per
// chunk) and each wanted parameter's.
struct Gradients {
  at::Tensor first;
  std::vector<at::Tensor> params;
};

// Runs chunk c with a graph, adds the gradient of seed . terms into `g` (seed [T]; undefined:
// the caller's loss_weights) and returns the chunk's terms, detached. `has_graph`, when given,
// receives which terms had a graph.
at::Tensor chunk_with_gradient(const ReduceCall& call, const at::Tensor& first,
                               const std::vector<at::Tensor>& params,
                               const std::vector<bool>& want_p, int64_t c, const at::Tensor& seed,
                               Gradients& g, std::vector<bool>* has_graph) {
  const int64_t from = c * call.chunk, len = std::min(call.chunk, call.length - from);
  std::vector<at::Tensor> s = call.slices(first, c);
  s[0] = s[0].detach().requires_grad_(g.first.defined());
  std::vector<at::Tensor> wrt;
  if (g.first.defined()) wrt.push_back(s[0]);
  for (size_t j = 0; j < params.size(); ++j)
    if (want_p[j]) wrt.push_back(params[j]);
  at::Tensor t;
  {
    at::AutoGradMode enable(true);
    const std::vector<at::Tensor> terms = call.fn(s, params);
    t = flat_terms(terms);
    if (has_graph) {
      has_graph->resize(t.size(0), false);
      size_t k = 0;
      for (const auto& term : terms)
        for (int64_t e = 0; e < term.numel(); ++e, ++k)
          (*has_graph)[k] = (*has_graph)[k] || term.requires_grad();
    }
  }
  if (t.requires_grad() && !wrt.empty()) {
    at::Tensor direction = seed;
    if (!direction.defined()) {
      std::vector<double> w(t.size(0));
      for (size_t i = 0; i < w.size(); ++i) w[i] = call.weight(i);
      direction = at::tensor(w, at::TensorOptions().dtype(at::kDouble));
    }
    const auto d = torch::autograd::grad({t}, wrt, {direction.to(t.options())},
                                         /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    size_t k = 0;
    if (g.first.defined()) {
      if (d[k].defined()) g.first.narrow(call.dim, from, len).copy_(d[k]);
      ++k;
    }
    for (size_t j = 0; j < params.size(); ++j) {
      if (!want_p[j]) continue;
      if (d[k].defined()) g.params[j] = g.params[j].defined() ? g.params[j] + d[k] : d[k];
      ++k;
    }
  }
  return t.detach();
}

// c with seed[i] = c * weight(i) for every term element that had a graph (within float rounding),
// or nothing.
std::optional<double> seed_scale(const ReduceCall& call, const at::Tensor& seed,
                                 const std::vector<bool>& has_graph) {
  const at::Tensor host = seed.to(at::kCPU, at::kDouble).contiguous();
  const double* s = host.data_ptr<double>();
  size_t ref = has_graph.size();
  for (size_t i = 0; i < has_graph.size(); ++i)
    if (has_graph[i] && call.weight(i) != 0 &&
        (ref == has_graph.size() || std::abs(call.weight(i)) > std::abs(call.weight(ref))))
      ref = i;
  if (ref == has_graph.size()) return std::nullopt;
  const double c = s[ref] / call.weight(ref);
  for (size_t i = 0; i < has_graph.size(); ++i) {
    if (!has_graph[i]) continue;
    const double expect = c * call.weight(i);
    if (std::abs(s[i] - expect) > 1e-6 * std::max(std::abs(s[i]), std::abs(expect)))
      return std::nullopt;
  }
  return c;
}

// Inputs: the first sliced tensor, then the params; output: the summed terms [T]. Forward runs
// each chunk with a graph and takes at once the gradient of the caller's loss direction
// (loss_weights . terms); backward scales the gradients kept by the factor the loss applied, so
// no chunk is computed twice. A seed in another direction reruns each chunk in backward with it.
struct ChunkReduce : torch::autograd::Function<ChunkReduce> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                const c10::intrusive_ptr<ReduceCall>& call) {
    const at::Tensor& first = inputs[0];
    const std::vector<at::Tensor> params(inputs.begin() + 1, inputs.end());
    std::vector<bool> want_p;
    for (const auto& p : params) want_p.push_back(p.requires_grad());
    Gradients g;
    if (first.requires_grad()) g.first = at::zeros_like(first);
    g.params.resize(params.size());
    std::vector<bool> has_graph;
    at::Tensor total;
    for (int64_t c = 0; c < call->chunks(); ++c) {
      at::Tensor t =
          chunk_with_gradient(*call, first, params, want_p, c, at::Tensor(), g, &has_graph);
      total = total.defined() ? total + t : t;
    }
    ctx->save_for_backward({first});
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->saved_data["params"] = c10::IValue(c10::List<at::Tensor>(params));
    ctx->saved_data["grad_first"] = g.first;
    ctx->saved_data["grad_params"] = c10::IValue(c10::List<std::optional<at::Tensor>>(
        std::vector<std::optional<at::Tensor>>(g.params.begin(), g.params.end())));
    ctx->saved_data["has_graph"] =
        c10::IValue(std::vector<int64_t>(has_graph.begin(), has_graph.end()));
    return {total};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call = c10::static_intrusive_pointer_cast<ReduceCall>(ctx->saved_data["call"].toCapsule());
    const at::Tensor first = ctx->get_saved_variables()[0];
    const auto plist = ctx->saved_data["params"].toTensorList();
    std::vector<at::Tensor> params(plist.begin(), plist.end());
    const std::vector<int64_t> graph_list = ctx->saved_data["has_graph"].toIntVector();
    const std::vector<bool> has_graph(graph_list.begin(), graph_list.end());
    std::vector<bool> want_p;
    for (size_t j = 0; j < params.size(); ++j) want_p.push_back(ctx->needs_input_grad(1 + j));
    Gradients g;
    g.params.resize(params.size());
    if (const std::optional<double> c = seed_scale(*call, grads[0], has_graph)) {
      // The gradients forward took, times the factor the loss applied.
      const at::Tensor kept = ctx->saved_data["grad_first"].toTensor();
      if (ctx->needs_input_grad(0) && kept.defined()) g.first = kept * *c;
      const auto kept_p = ctx->saved_data["grad_params"].toList();
      for (size_t j = 0; j < params.size(); ++j) {
        const c10::IValue v = kept_p.get(j);
        if (want_p[j] && v.isTensor() && v.toTensor().defined()) g.params[j] = v.toTensor() * *c;
      }
    } else {
      if (ctx->needs_input_grad(0)) g.first = at::zeros_like(first);
      for (int64_t c = 0; c < call->chunks(); ++c)
        chunk_with_gradient(*call, first, params, want_p, c, grads[0], g, nullptr);
    }
    torch::autograd::variable_list result(1 + params.size() + 1);
    result[0] = g.first;
    for (size_t j = 0; j < params.size(); ++j) result[1 + j] = g.params[j];
    return result;
  }
};

}  // namespace

at::Tensor chunk_reduce(const ChunkTermsFn& fn, const std::vector<at::Tensor>& sliced,
                        const std::vector<at::Tensor>& params, int64_t chunk, int64_t dim,
                        const std::vector<double>& loss_weights) {
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
      at::Tensor t = flat_terms(fn(s, params));
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
  call->loss_weights = loss_weights;
  std::vector<at::Tensor> inputs{sliced[0]};
  inputs.insert(inputs.end(), params.begin(), params.end());
  return ChunkReduce::apply(at::TensorList(inputs), call)[0];
}

}  // namespace fsdp::model
