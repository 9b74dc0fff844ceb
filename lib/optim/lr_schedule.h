// Learning-rate schedules as pure functions of the optimizer step (spec section 6). They hold no
// state, so resuming a run only needs the step count; they never read flags or the clock.
#pragma once

#include <cstdint>

namespace fsdp::optim {

// Warmup steps for a ratio: int(warmup_ratio * total_steps), as the reference truncates.
int64_t warmup_steps(double warmup_ratio, int64_t total_steps);

// Linear warmup then cosine decay to 0, at optimizer step n (1-based):
//   n <= W: base * n / W;   n > W: base * 0.5 * (1 + cos(pi * (n - 1 - W) / (total - W)))
// n is clamped to total (the reference would start rising again past total).
// Throws fsdp::UsageError when total_steps < 1, warmup < 0 or warmup > total_steps.
double warmup_cosine_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup);

}  // namespace fsdp::optim
