// When the loop logs, saves, evaluates and stops (docs/reference.md §6): pure functions of the
// step just completed, its place in the epoch and the configured intervals. They never touch
// files, ranks or the clock, so every combination is unit-tested (tests/unit/train/cadence.cpp).
#pragma once

#include <cstdint>

#include "config/train_config.h"

namespace fsdp::train {

// The intervals that decide what happens after a step; 0 switches an interval off.
struct Cadence {
  int64_t log_steps = 1;       // --log-steps (at least 1)
  int64_t save_steps = 0;      // --save-steps
  int64_t save_epochs = 0;     // --save-interval: every N epochs
  int64_t eval_steps = 0;      // --eval-steps
  int64_t eval_epochs = 0;     // --eval-interval: every N epochs
  bool has_eval_data = false;  // an evaluation set was given: evaluations only run then
  int64_t stop_at = 0;         // the last step: min(--max-steps, total steps)
};

// The cadence of a run: the configuration's intervals, training until stop_at.
Cadence make_cadence(const config::TrainConfig& cfg, bool has_eval_data, int64_t stop_at);

// The step just completed.
struct StepPoint {
  int64_t step = 0;         // 1-based optimizer step
  int64_t epoch = 0;        // 0-based epoch it belongs to
  bool ends_epoch = false;  // it consumed the epoch's last micro-batch
};

// What the loop does after that step, in this order: log, save, evaluate, then (after the
// ranks agree on a stop signal: after_signal) stop.
struct AfterStep {
  bool log = false;
  // A save by --save-steps. Not when the epoch's end saves anyway (that save holds the same
  // weights with the position at the next epoch's start).
  bool save = false;
  bool evaluate = false;  // an --eval-steps evaluation now
  // An --eval-steps evaluation after the epoch-end save: saves come before evaluations, so
  // that unreadable evaluation data cannot cost the checkpoint.
  bool evaluate_after_epoch = false;
  bool stop = false;  // stop_at reached: no further step
};

AfterStep after_step(const Cadence& c, const StepPoint& p);

// A stop signal, agreed by every rank after the step's saves and evaluations (a signal may
// reach only some ranks): stop, and save unless the step is saved already.
struct AfterSignal {
  bool save = false;
  bool stop = false;
};

AfterSignal after_signal(bool stop_requested, bool step_saved);

// At the end of an epoch that ran to its last micro-batch (not one cut by a signal or by
// stop_at inside it): save, then evaluate (after any evaluation AfterStep deferred).
struct AfterEpoch {
  bool save = false;
  bool evaluate = false;
};

AfterEpoch after_epoch(const Cadence& c, int64_t epoch);

// Whether the epoch ended: its data ran out, or the last step (stop_at) consumed its last
// micro-batch. A stop for a signal never ends the epoch (the resumed run finishes it).
bool epoch_completed(bool stopped, bool stopped_for_signal, bool data_consumed);

// When training ends: the newest step is saved (--save-final, a failure ends the run with an
// error), or a warning says it is not (--save-final false), or nothing is left to do (it is
// saved, or no step was taken).
enum class FinalSave { kNone, kSave, kWarnUnsaved };

FinalSave final_save(bool save_final, bool step_saved, int64_t step);

}  // namespace fsdp::train
