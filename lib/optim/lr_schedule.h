// Learning-rate schedules as pure functions of the optimizer step (docs/reference.md §6): a
// linear warmup, then cosine, linear or constant. They hold no state, so resuming a run only
// needs the step count; they never read flags or the clock.
#pragma once

#include <cstdint>

namespace fsdp::optim {

// What follows the warmup.
enum class LrDecay {
  kCosine,    // half a cosine from the base rate to 0 (the reference's schedule)
  kLinear,    // a straight line from the base rate to 0 at the last step
  kConstant,  // the base rate to the end
};

// Warmup steps for a ratio: int(warmup_ratio * total_steps), as the reference truncates.
int64_t warmup_steps(double warmup_ratio, int64_t total_steps);

// Throws fsdp::UsageError unless total_steps >= 1 and 0 <= warmup <= total_steps. Every schedule
// below checks this first.
void check_schedule(int64_t total_steps, int64_t warmup);

// The one warmup formula, at optimizer step n (1-based) with 1 <= n <= warmup: base * n / W.
double warmup_lr(double base_lr, int64_t step, int64_t warmup);

// Linear warmup then cosine decay to 0, at optimizer step n (1-based):
//   n <= W: base * n / W;   n > W: base * 0.5 * (1 + cos(pi * (n - 1 - W) / (total - W)))
// n is clamped to total (the reference would start rising again past total).
double warmup_cosine_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup);

// Linear warmup then a linear decay: n > W: base * max(total - n, 0) / max(total - W, 1), so the
// last step (n = total) trains at 0, as transformers' linear schedule does.
double warmup_linear_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup);

// Linear warmup then the base rate.
double warmup_constant_lr(double base_lr, int64_t step, int64_t total_steps, int64_t warmup);

// The schedule `decay` at step n: one of the three above.
double scheduled_lr(LrDecay decay, double base_lr, int64_t step, int64_t total_steps,
                    int64_t warmup);

}  // namespace fsdp::optim
