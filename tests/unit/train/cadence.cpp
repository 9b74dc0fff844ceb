// The loop's cadence as a table: for each combination of intervals (saves and evaluations by
// steps and by epochs, max steps, total steps), position (epoch end or not), end of data and
// stop signal, what follows a step and an epoch.
#include <catch2/catch.hpp>

#include "train/cadence.h"

using namespace fsdp::train;

namespace {
Cadence cadence(int64_t log, int64_t save_steps, int64_t save_epochs, int64_t eval_steps,
                int64_t eval_epochs, bool eval_data, int64_t stop_at) {
  Cadence c;
  c.log_steps = log;
  c.save_steps = save_steps;
  c.save_epochs = save_epochs;
  c.eval_steps = eval_steps;
  c.eval_epochs = eval_epochs;
  c.has_eval_data = eval_data;
  c.stop_at = stop_at;
  return c;
}
}  // namespace

TEST_CASE("what follows a step", "[train]") {
  struct Row {
    const char* what;
    Cadence c;
    StepPoint p;
    bool log, save, evaluate, evaluate_after_epoch, stop;
  };
  const Row rows[] = {
      // log: every --log-steps, and always at the last step
      {"log interval hit", cadence(5, 0, 0, 0, 0, false, 100), {10, 0, false}, 1, 0, 0, 0, 0},
      {"log interval missed", cadence(5, 0, 0, 0, 0, false, 100), {11, 0, false}, 0, 0, 0, 0, 0},
      {"last step logs", cadence(5, 0, 0, 0, 0, false, 13), {13, 0, false}, 1, 0, 0, 0, 1},
      // save by steps
      {"save steps hit", cadence(50, 4, 0, 0, 0, false, 100), {8, 0, false}, 0, 1, 0, 0, 0},
      {"save steps missed", cadence(50, 4, 0, 0, 0, false, 100), {9, 0, false}, 0, 0, 0, 0, 0},
      {"save steps off", cadence(50, 0, 1, 0, 0, false, 100), {8, 0, false}, 0, 0, 0, 0, 0},
      // the epoch's end saves instead (same weights, next epoch's position)
      {"epoch end saves", cadence(50, 4, 1, 0, 0, false, 100), {8, 0, true}, 0, 0, 0, 0, 0},
      {"epoch end, other epoch", cadence(50, 4, 2, 0, 0, false, 100), {8, 0, true}, 0, 1, 0, 0, 0},
      {"epoch end, 2nd epoch", cadence(50, 4, 2, 0, 0, false, 100), {8, 1, true}, 0, 0, 0, 0, 0},
      {"save epochs, not end", cadence(50, 4, 1, 0, 0, false, 100), {8, 0, false}, 0, 1, 0, 0, 0},
      // evaluation by steps: needs evaluation data; after the epoch-end save when there is one
      {"eval steps", cadence(50, 0, 0, 3, 0, true, 100), {6, 0, false}, 0, 0, 1, 0, 0},
      {"eval steps missed", cadence(50, 0, 0, 3, 0, true, 100), {7, 0, false}, 0, 0, 0, 0, 0},
      {"eval steps, no data", cadence(50, 0, 0, 3, 0, false, 100), {6, 0, false}, 0, 0, 0, 0, 0},
      {"eval deferred", cadence(50, 0, 1, 3, 0, true, 100), {6, 0, true}, 0, 0, 0, 1, 0},
      {"eval not deferred", cadence(50, 0, 2, 3, 0, true, 100), {6, 0, true}, 0, 0, 1, 0, 0},
      {"eval + save steps", cadence(50, 3, 0, 3, 0, true, 100), {6, 0, true}, 0, 1, 1, 0, 0},
      // max steps / total steps: stop_at is their minimum
      {"stop at", cadence(50, 0, 0, 0, 0, false, 6), {6, 0, false}, 1, 0, 0, 0, 1},
      {"past stop at", cadence(50, 0, 0, 0, 0, false, 6), {7, 1, false}, 0, 0, 0, 0, 1},
      {"stop at epoch end", cadence(50, 0, 1, 0, 0, false, 6), {6, 0, true}, 1, 0, 0, 0, 1},
      {"everything", cadence(2, 2, 1, 2, 1, true, 4), {4, 1, true}, 1, 0, 0, 1, 1},
  };
  for (const Row& r : rows) {
    INFO(r.what);
    const AfterStep a = after_step(r.c, r.p);
    CHECK(a.log == r.log);
    CHECK(a.save == r.save);
    CHECK(a.evaluate == r.evaluate);
    CHECK(a.evaluate_after_epoch == r.evaluate_after_epoch);
    CHECK(a.stop == r.stop);
    CHECK(!(a.evaluate && a.evaluate_after_epoch));  // one evaluation per step at most
  }
}

TEST_CASE("a stop signal saves unless the step is saved", "[train]") {
  CHECK(!after_signal(false, false).stop);
  CHECK(!after_signal(false, false).save);
  CHECK(after_signal(true, false).stop);
  CHECK(after_signal(true, false).save);
  CHECK(after_signal(true, true).stop);
  CHECK(!after_signal(true, true).save);
}

TEST_CASE("what follows an epoch", "[train]") {
  struct Row {
    Cadence c;
    int64_t epoch;
    bool save, evaluate;
  };
  const Row rows[] = {
      {cadence(1, 0, 1, 0, 1, true, 9), 0, 1, 1},  // SpecForge's defaults
      {cadence(1, 0, 0, 0, 0, true, 9), 0, 0, 0},  // both off
      {cadence(1, 0, 2, 0, 3, true, 9), 0, 0, 0},  // every 2nd / 3rd epoch: not the 1st
      {cadence(1, 0, 2, 0, 3, true, 9), 1, 1, 0},
      {cadence(1, 0, 2, 0, 3, true, 9), 2, 0, 1},
      {cadence(1, 0, 2, 0, 3, true, 9), 5, 1, 1},
      {cadence(1, 5, 1, 5, 1, false, 9), 0, 1, 0},  // no evaluation data: no evaluation
  };
  for (const Row& r : rows) {
    INFO("epoch " << r.epoch);
    const AfterEpoch a = after_epoch(r.c, r.epoch);
    CHECK(a.save == r.save);
    CHECK(a.evaluate == r.evaluate);
  }
}

TEST_CASE("when an epoch is complete", "[train]") {
  // End of data (the loop ran out of micro-batches without a stop).
  CHECK(epoch_completed(/*stopped=*/false, /*signal=*/false, /*consumed=*/true));
  CHECK(epoch_completed(false, false, false));
  // stop_at inside the epoch: not complete; at its last micro-batch: complete.
  CHECK(!epoch_completed(true, false, false));
  CHECK(epoch_completed(true, false, true));
  // A signal never completes the epoch, even at its last micro-batch.
  CHECK(!epoch_completed(true, true, true));
  CHECK(!epoch_completed(true, true, false));
}

TEST_CASE("the final save", "[train]") {
  CHECK(final_save(true, false, 5) == FinalSave::kSave);
  CHECK(final_save(true, true, 5) == FinalSave::kNone);
  CHECK(final_save(true, false, 0) == FinalSave::kNone);  // no step taken
  CHECK(final_save(false, false, 5) == FinalSave::kWarnUnsaved);
  CHECK(final_save(false, true, 5) == FinalSave::kNone);
  CHECK(final_save(false, false, 0) == FinalSave::kNone);
}

TEST_CASE("the cadence of a configuration", "[train]") {
  fsdp::config::TrainConfig cfg;
  cfg.metrics.log_steps = 7;
  cfg.checkpoint.save_steps = 3;
  cfg.checkpoint.save_interval = 2;
  cfg.eval.eval_steps = 4;
  cfg.eval.eval_interval = 5;
  const Cadence c = make_cadence(cfg, true, 42);
  CHECK(c.log_steps == 7);
  CHECK(c.save_steps == 3);
  CHECK(c.save_epochs == 2);
  CHECK(c.eval_steps == 4);
  CHECK(c.eval_epochs == 5);
  CHECK(c.has_eval_data);
  CHECK(c.stop_at == 42);
  CHECK(!make_cadence(cfg, false, 1).has_eval_data);
}
