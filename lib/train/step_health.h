// Skipped optimizer steps (non-finite gradients) and the gradient norm, accounted without a host
// read per step when the engine keeps its step scalars on the device (a GPU): those results are
// summed on the device and read at flush() (the trainer flushes at logging steps, before every
// checkpoint and at the end). Host-resolved results are checked at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "shard/engine.h"

namespace fsdp::train {

class StepHealth {
 public:
  // `skipped_steps` is incremented for every skipped step accounted (the run state's counter);
  // max_consecutive consecutive skipped steps end the run with fsdp::Error.
  StepHealth(int max_consecutive, int64_t* skipped_steps)
      : max_consecutive_(max_consecutive), skipped_steps_(skipped_steps) {}

  // One optimizer step's result; `step` is the trainer's step number.
  void add(const shard::StepResult& r, int64_t step);
  // Accounts what is pending (one host read when anything is): a warning naming the skipped
  // steps, and the error after max_consecutive consecutive ones. No-op when nothing is pending.
  void flush();
  // The newest accounted gradient norm (flush first for device results).
  double last_grad_norm() const { return last_norm_; }
  int consecutive() const { return consecutive_; }

 private:
  void check_consecutive(int64_t max_run, int64_t last_step) const;

  int max_consecutive_;
  int64_t* skipped_steps_;
  int consecutive_ = 0;
  double last_norm_ = 0.0;
  // Pending device results: skipped count, current and longest run of consecutive skipped
  // steps, newest norm, and the step range they cover.
  bool pending_ = false;
  at::Tensor skipped_t_, run_t_, max_run_t_, norm_t_;
  int64_t first_step_ = 0, last_step_ = 0;
};

}  // namespace fsdp::train
