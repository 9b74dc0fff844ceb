// The best checkpoint of a run (--save-best-by, docs/checkpoints.md "The best checkpoint"): which
// evaluation metric decides and in which direction, the best so far (read back from
// <output-dir>/best.json on resume), and publishing a new best (best.json written atomically,
// then the <output-dir>/best link). Acceptance commonly peaks mid-run while the loss keeps
// falling (DeepSpec issue #84), so the newest checkpoint is not always the one to serve. Rank 0's
// file-system side only: it never saves a checkpoint and never talks to other ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

// What an evaluation reports, as the metrics logger takes it.
using MetricScalars = std::vector<std::pair<std::string, double>>;

// The record of the best checkpoint next to the checkpoints.
inline constexpr const char* kBestRecordFile = "best.json";

// The metric that decides the best checkpoint, and whether lower is better: names containing
// "loss" (eval/loss, eval/ploss_0) are minimised, every other one (eval/accept_len, eval/acc_0,
// eval/simulated_acc_len) maximised.
struct BestMetric {
  std::string name;  // with its prefix: "eval/accept_len"
  bool minimise = false;
  const char* direction() const { return minimise ? "min" : "max"; }
};

// Parses --save-best-by: nullopt for "none"; a name without a prefix gets "eval/". Throws
// UsageError (exit 2, at start-up) for names no evaluation can produce: another prefix
// ("train/loss": only evaluations decide), a per-step metric of a TTT step at or beyond
// ttt_length ("eval/acc_7" with --ttt-length 7), a count (eval/zero_loss_samples), an empty name.
// Other names are known only at the first evaluation (BestTracker::improvement warns then).
std::optional<BestMetric> parse_best_metric(const std::string& value, int64_t ttt_length);

// <output-dir>/best.json.
struct BestRecord {
  std::string metric;      // BestMetric::name
  std::string direction;   // "max" or "min"
  int64_t step = 0;        // the optimizer step evaluated and saved
  int64_t epoch = 0;       // the epoch in the checkpoint's name
  double value = 0;        // the metric's value at that evaluation
  std::string checkpoint;  // the checkpoint directory's name, e.g. "epoch_1_step_40"
};

std::string best_record_json(const BestRecord& r);
// Writes <output_dir>/best.json atomically (a temporary file, fsynced, renamed over it). Throws
// Error naming the file.
void write_best_record(const std::string& output_dir, const BestRecord& r);
// The record in <output_dir>/best.json; nullopt when there is none. Throws Error naming the
// file when it cannot be parsed.
std::optional<BestRecord> read_best_record(const std::string& output_dir);

class BestTracker {
 public:
  BestTracker(std::string output_dir, BestMetric metric);
  const BestMetric& metric() const { return metric_; }
  // The best so far (none yet: nullopt).
  const std::optional<BestRecord>& best() const { return best_; }
  // A resumed run takes the best so far from best.json when it is of this metric (a different
  // metric starts anew) and its checkpoint is still a complete one (the record of an abandoned
  // branch or of a checkpoint deleted by hand is dropped); the best link is pointed at it again
  // (a crash between best.json and the link). Returns a line saying what was taken or why not
  // ("" when there was no best.json).
  std::string resume();
  // The metric's value in one evaluation's scalars when it beats the best so far; nullopt
  // otherwise. Strictly better only: a tie keeps the earlier checkpoint (fewer steps, and no
  // save just for a tie). NaN never wins. A metric the evaluation does not log warns once,
  // naming those it logs, and never wins.
  std::optional<double> improvement(const MetricScalars& eval);
  // Makes checkpoint_dir (saved after `step`, its name's epoch `epoch`) the best with `value`:
  // best.json first, then the <output-dir>/best link. Throws Error when either cannot be written
  // (the best so far in memory is updated all the same: a later, worse evaluation must not win).
  void record(double value, int64_t step, int64_t epoch, const std::string& checkpoint_dir);

 private:
  std::string output_dir_;
  BestMetric metric_;
  std::optional<BestRecord> best_;
  bool warned_missing_ = false;
};

}  // namespace fsdp::train
