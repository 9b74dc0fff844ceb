// The loop's cadence (see cadence.h): which of log, save, evaluate and stop follow a step or an
// epoch. Pure: no state, no I/O, the same answer on every rank.
#include "train/cadence.h"

namespace fsdp::train {

namespace {
bool every(int64_t interval, int64_t count) {
  return interval > 0 && count % interval == 0;
}
}  // namespace

Cadence make_cadence(const config::TrainConfig& cfg, bool has_eval_data, int64_t stop_at) {
  Cadence c;
  c.log_steps = cfg.metrics.log_steps;
  c.save_steps = cfg.checkpoint.save_steps;
  c.save_epochs = cfg.checkpoint.save_interval;
  c.eval_steps = cfg.eval.eval_steps;
  c.eval_epochs = cfg.eval.eval_interval;
  c.has_eval_data = has_eval_data;
  c.stop_at = stop_at;
  return c;
}

AfterStep after_step(const Cadence& c, const StepPoint& p) {
  AfterStep a;
  const int64_t n = p.step;
  a.log = every(c.log_steps, n) || n == c.stop_at;
  const bool epoch_end_saves = p.ends_epoch && every(c.save_epochs, p.epoch + 1);
  a.save = every(c.save_steps, n) && !epoch_end_saves;
  if (c.has_eval_data && every(c.eval_steps, n)) {
    (epoch_end_saves ? a.evaluate_after_epoch : a.evaluate) = true;
  }
  a.stop = n >= c.stop_at;
  return a;
}

AfterSignal after_signal(bool stop_requested, bool step_saved) {
  AfterSignal a;
  a.stop = stop_requested;
  a.save = stop_requested && !step_saved;
  return a;
}

AfterEpoch after_epoch(const Cadence& c, int64_t epoch) {
  AfterEpoch a;
  a.save = every(c.save_epochs, epoch + 1);
  a.evaluate = c.has_eval_data && every(c.eval_epochs, epoch + 1);
  return a;
}

bool epoch_completed(bool stopped, bool stopped_for_signal, bool data_consumed) {
  if (stopped_for_signal) return false;
  return data_consumed || !stopped;
}

FinalSave final_save(bool save_final, bool step_saved, int64_t step) {
  if (step_saved || step <= 0) return FinalSave::kNone;
  return save_final ? FinalSave::kSave : FinalSave::kWarnUnsaved;
}

}  // namespace fsdp::train
