// Unit boundaries announced by model code. LibTorch's C++ modules have no forward hooks, so a
// model calls run_unit() around each top-level submodule it uses; with no hooks installed this
// is a plain call. The sharding engine installs hooks to gather parameters before a unit runs,
// release them after, and attach backward hooks to the unit's outputs. Model code stays
// unaware of distribution: it only names its units. Never put sharding logic here.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

namespace fsdp {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Before the unit's forward (may block until its parameters are available).
  virtual void pre_forward(const std::string& unit) = 0;
  // After the unit's forward, with its output; may register autograd hooks on it.
  virtual void post_forward(const std::string& unit, const at::Tensor& output) = 0;
};

// Runs fn() as one use of `unit`, bracketed by the hooks when installed.
template <typename Fn>
at::Tensor run_unit(UnitHooks* hooks, const std::string& unit, Fn&& fn) {
  if (hooks) hooks->pre_forward(unit);
  at::Tensor out = std::forward<Fn>(fn)();
  if (hooks) hooks->post_forward(unit, out);
  return out;
}

}  // namespace fsdp
