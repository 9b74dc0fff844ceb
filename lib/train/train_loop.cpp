// The optimisation loop (docs/reference.md §6): epochs of micro-batches in sampler order,
// composed from the step runner (one micro-batch, one optimizer step, the agreement on a failed
// read), the cadence (when to log, save, evaluate, stop) and the learning-rate schedule. Only
// the order of those parts lives here. Everything is collective: every rank runs the same steps.
#include <ATen/ATen.h>

#include <filesystem>
#include <optional>

#include "checkpoint/checkpoint_dir.h"
#include "comm/runtime.h"
#include "config/run_config.h"
#include "core/env.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loss_mask_stats.h"
#include "data/packing.h"
#include "metrics/meters.h"
#include "metrics/profiler.h"
#include "model/flops.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/best_checkpoint.h"
#include "train/cadence.h"
#include "train/component_options.h"
#include "train/feature_loader.h"
#include "train/signals.h"
#include "train/step_health.h"
#include "train/step_metrics.h"
#include "train/step_runner.h"
#include "train/stuck_metrics.h"
#include "train/trainer_impl.h"

namespace fsdp::train {

namespace {

// The communicators the engine's collectives run on (whose waits are the steps' exposed
// communication).
std::vector<comm::Communicator*> engine_communicators(const shard::ShardEngine& engine) {
  std::vector<comm::Communicator*> out;
  const auto& g = engine.groups();
  if (g.shard) out.push_back(g.shard.get());
  if (g.replicate && g.replicate != g.shard) out.push_back(g.replicate.get());
  return out;
}

const char* failure_text(ReadFailure why) {
  switch (why) {
    case ReadFailure::kBadSample:
      return "a bad sample stops the run";
    case ReadFailure::kLoaderError:
      return "the data loader failed";
    case ReadFailure::kOtherRank:
      return "data loading failed on another rank";
  }
  return "data loading failed";
}

// This rank's samples without a loss token, loss tokens and micro-batches in one epoch (this
// run's part of it).
struct EpochCounts {
  int64_t zero_loss = 0, loss_tokens = 0, batches = 0;
  void add(const data::Batch& b) {
    ++batches;
    zero_loss += data::zero_loss_rows(b);
    loss_tokens += b.num_loss_tokens();
  }
};

}  // namespace

// The state of one training run between its parts: meters, windows, what is saved.
class TrainLoop {
 public:
  TrainLoop(Trainer::Impl& t, data::DataLoader& loader, int64_t per_epoch, Cadence cadence,
            std::optional<BestMetric> best_by);
  RunResult run();

 private:
  bool run_epoch(int64_t epoch);  // false when the run stops
  // --packing: the window's micro-batches (as the sampler gives them) trained as packed ones.
  void train_packed(const std::vector<data::Batch>& window);
  bool optimizer_step(int64_t epoch, int64_t b_index, Stopwatch& step_clock);
  void log_step(int64_t n, int64_t epoch);
  void end_epoch(int64_t epoch, const EpochCounts& counts);
  void report_zero_loss(int64_t epoch, const EpochCounts& counts,
                        std::vector<std::pair<std::string, double>>& scalars);
  void finish();
  bool save_now(int64_t epoch);                        // a periodic save; false when it failed
  void save_or_fail(int64_t epoch, const char* when);  // a save that ends the run
  void save_before_failure(int64_t epoch, const char* why);
  // An evaluation of the step `at`; `epoch` names a checkpoint saved for a new best.
  void evaluate_at(int64_t at, int64_t epoch);
  void keep_best(int64_t epoch);  // after an evaluation: a new best is saved and linked

  Trainer::Impl& t_;
  data::DataLoader& loader_;
  const int64_t per_epoch_;
  const Cadence cadence_;
  const optim::LrDecay decay_;
  PhaseTimer timer_;  // before runner_, which points at it
  StepRunner runner_;
  ReadAgreement agreement_;
  RunResult result_;
  metrics::ThroughputMeter meter_;
  StepMetrics window_, epoch_metrics_;
  // Skipped steps and the gradient norm: read at logging steps, saves and the end when the
  // engine keeps its step scalars on the device (no host synchronisation per step).
  StepHealth health_;
  std::unique_ptr<metrics::StepProfiler> profiler_;
  Stopwatch window_clock_;
  uint64_t read_bytes_ = 0;  // feature bytes this rank read for the batches of the log window
  double last_lr_ = 0;
  bool saved_at_step_ = false;      // the newest step is in a checkpoint
  int64_t deferred_eval_step_ = 0;  // an --eval-steps evaluation waiting for the epoch-end save
  // One evaluation per step: an epoch end that is also an --eval-steps multiple evaluates once.
  std::vector<std::pair<std::string, double>> last_eval_;
  int64_t last_eval_step_ = -1;
  int64_t epoch_now_ = 0;  // the epoch a failed evaluation's save is named after
  // The newest checkpoint this process saved: an evaluation setting a new best at that step
  // takes it instead of saving again.
  int64_t last_saved_step_ = -1;
  std::string last_saved_dir_;
  bool keeps_best_ = false;            // every rank: evaluations run and --save-best-by is on
  std::unique_ptr<BestTracker> best_;  // rank 0
  // Metrics stuck at exactly 0: the evaluations', else the training log's (after
  // kZeroMetricWarmupSteps steps) when the run evaluates nothing.
  bool evaluates_ = false;
  ZeroMetricWatch eval_zero_{"eval", "evaluations"};
  ZeroMetricWatch train_zero_{"train", "logging steps"};
};

TrainLoop::TrainLoop(Trainer::Impl& t, data::DataLoader& loader, int64_t per_epoch, Cadence cadence,
                     std::optional<BestMetric> best_by)
    : t_(t),
      loader_(loader),
      per_epoch_(per_epoch),
      cadence_(cadence),
      decay_(to_decay(t.cfg.optim.lr_scheduler)),
      timer_(t.topo.device(), engine_communicators(t.algo->engine())),
      runner_(StepRunner::Parts{
          t.algo.get(), &t.algo->engine(), t.cfg.shard.accumulate_locally, &timer_,
          [&t](at::Tensor& v) { t.topo.reduce_counts(v, comm::ReduceOp::kSum); }}),
      agreement_{t.topo.world(), [&t](bool mine) { return t.topo.any_rank(mine); }},
      meter_(metrics::resolve_peak_tflops(t.cfg.metrics.mfu_peak_tflops, t.topo.device())),
      window_(t.algo->metrics(), t.topo.metrics_device()),
      epoch_metrics_(t.algo->metrics(), t.topo.metrics_device()),
      health_(Trainer::kMaxConsecutiveNonFinite, &t.state.skipped_steps) {
  t_.logger = metrics::make_logger(
      t.cfg.metrics, sink_context(t.cfg, t.topo.rank(), t.total_steps, t.config_json, t.state,
                                  launch_attempt().attempt > 0));
  // Kept when this part of the run has no W&B sink: a later resume with W&B continues the run.
  if (const std::string id = t_.logger->wandb_run_id(); !id.empty()) t_.state.wandb_run_id = id;
  if (const std::string id = t_.logger->mlflow_run_id(); !id.empty()) t_.state.mlflow_run_id = id;
  // A resume inside an epoch: the epoch's metrics so far (rank 0 holds them; report() sums ranks).
  if (t.topo.is_root() && t.state.position > 0) epoch_metrics_.add_sums(t.state.epoch_metric_sums);
  // Just resumed: that step is saved already (a stop before the next step saves nothing again).
  saved_at_step_ = t.checkpointer.resuming() && t.state.step > 0;
  evaluates_ = cadence_.has_eval_data && (cadence_.eval_steps > 0 || cadence_.eval_epochs > 0);
  if (best_by && !evaluates_) {
    FSDP_LOG0(kInfo) << "--save-best-by " << best_by->name << ": this run evaluates nothing ("
                     << (cadence_.has_eval_data ? "--eval-interval and --eval-steps are 0"
                                                : "no --eval-hidden-states-path")
                     << "), so no best checkpoint is kept; <output-dir>/latest names the newest";
  }
  keeps_best_ = best_by && evaluates_;
  if (keeps_best_ && t.topo.is_root()) {
    best_ = std::make_unique<BestTracker>(t.checkpointer.output_dir(), *best_by);
    // A resumed run continues the best so far: a worse evaluation must not replace it. A fresh
    // run starts anew (a best.json left in the directory names no checkpoint of this run).
    if (t.checkpointer.resuming()) {
      try {
        const std::string line = best_->resume();
        if (!line.empty()) FSDP_LOG0(kInfo) << line;
      } catch (const std::exception& e) {
        FSDP_LOG0(kWarn) << "--save-best-by: " << error_text(e);
      }
    }
  }
}

RunResult TrainLoop::run() {
  if (t_.state.step >= cadence_.stop_at) {
    // Nothing left to train. A fresh run with --max-steps 0 exports the initial draft (the
    // starting point of parity checks against other trainers).
    if (t_.state.step == 0) {
      save_or_fail(t_.state.epoch, "exporting the initial draft");
    } else {
      FSDP_LOG0(kInfo) << "already at step " << t_.state.step << " (stop at " << cadence_.stop_at
                       << "): nothing to train";
    }
    t_.logger->close();
    result_.steps = t_.state.step;
    return result_;
  }
  window_clock_.reset();
  if (t_.cfg.profile.enabled) {
    // SpecForge's variable for where traces go.
    const auto env_dir = env::text("SGLANG_TORCH_PROFILER_DIR");
    profiler_ = std::make_unique<metrics::StepProfiler>(
        profiler_options(t_.cfg, t_.topo.device(), t_.topo.rank(), env_dir.value_or("")));
  }
  for (int64_t epoch = t_.state.epoch; epoch < t_.cfg.loop.num_epochs; ++epoch) {
    if (!run_epoch(epoch)) break;
  }
  finish();
  return result_;
}

bool TrainLoop::run_epoch(int64_t epoch) {
  epoch_now_ = epoch;
  loader_.start({epoch, epoch == t_.state.epoch ? t_.state.position : 0});
  const int64_t accum = t_.plan.accumulation_steps;
  int64_t in_group = 0;
  EpochCounts counts;
  Stopwatch step_clock;
  bool stop = false;
  std::vector<data::Batch> window;  // --packing: the window read so far
  while (!stop) {
    if (profiler_ && in_group == 0) profiler_->before_step(t_.state.step + 1);
    // A bad sample (without --skip-bad-samples) or another loader failure stops the run on every
    // rank, after saving the last completed step: fixing the cause and --resume lose nothing.
    auto batch =
        read_agreed([&] { return loader_.next(); }, agreement_, "data loading",
                    [&](ReadFailure why) { save_before_failure(epoch, failure_text(why)); });
    if (!batch) break;
    *batch = t_.topo.share(std::move(*batch), t_.cfg.model.ttt_length - 1);
    counts.add(*batch);
    read_bytes_ += batch->bytes_read;
    const int64_t b_index = batch->batch_index;
    const bool last_in_group =
        in_group == accum - 1 || b_index == per_epoch_ - 1 || batch->ends_stream;
    ++in_group;
    if (t_.cfg.loop.packing) {
      window.push_back(std::move(*batch));
      if (!last_in_group) continue;
      train_packed(window);
      window.clear();
    } else {
      runner_.micro_batch(*batch, last_in_group);
      if (!last_in_group) continue;
    }
    in_group = 0;
    stop = optimizer_step(epoch, b_index, step_clock);
  }
  const bool data_consumed = loader_.state().position >= per_epoch_;
  if (!epoch_completed(stop, result_.stopped_by_signal, data_consumed)) return false;
  end_epoch(epoch, counts);
  return !stop;
}

void TrainLoop::train_packed(const std::vector<data::Batch>& window) {
  std::vector<data::Sample> samples;
  std::vector<int64_t> lengths, indices;
  for (const data::Batch& b : window) {
    for (data::Sample& s : data::split_rows(b)) {
      lengths.push_back(s.input_ids.size(0));
      samples.push_back(std::move(s));
    }
    indices.insert(indices.end(), b.sample_indices.begin(), b.sample_indices.end());
  }
  const int64_t budget = t_.cfg.loop.packing_budget > 0
                             ? t_.cfg.loop.packing_budget
                             : t_.cfg.data.max_length * t_.plan.micro_batch;
  // Every rank runs the same number of micro-batches (each one's collectives): the most any
  // rank's window needs. Ranks' windows hold the same number of samples, so it always fits.
  int64_t bins = data::count_bins(lengths, budget);
  if (t_.topo.world() > 1) {
    at::Tensor n = at::tensor({bins}, at::kLong);
    t_.topo.reduce_counts(n, comm::ReduceOp::kMax);
    bins = n.item<int64_t>();
  }
  const auto plan = data::pack_bins(lengths, budget, bins);
  for (size_t k = 0; k < plan.size(); ++k) {
    std::vector<data::Sample> docs;
    std::vector<int64_t> doc_indices;
    for (const int64_t j : plan[k]) {
      docs.push_back(samples[static_cast<size_t>(j)]);
      doc_indices.push_back(indices[static_cast<size_t>(j)]);
    }
    data::Batch packed = data::collate_packed(docs, /*pin_memory=*/!t_.topo.device().is_cpu());
    packed.sample_indices = std::move(doc_indices);
    packed.epoch = window.back().epoch;
    packed.batch_index = window.back().batch_index;
    runner_.micro_batch(packed, k + 1 == plan.size());
  }
}

// One optimizer step over the micro-batches run, then what the cadence asks for. True when the
// run stops after it.
bool TrainLoop::optimizer_step(int64_t epoch, int64_t b_index, Stopwatch& step_clock) {
  for (const auto& o : runner_.take_outputs()) {
    window_.add(o);
    epoch_metrics_.add(o);
  }
  const int64_t n = t_.state.step + 1;
  last_lr_ = optim::scheduled_lr(decay_, t_.cfg.optim.learning_rate, n, t_.total_steps, t_.warmup);
  health_.add(runner_.optimizer_step(last_lr_, t_.cfg.optim.max_grad_norm), n);
  t_.state.step = n;
  t_.state.epoch = epoch;
  t_.state.position = b_index + 1;
  if (profiler_) profiler_->after_step(n);
  const auto [tokens, flops] = runner_.take_work();
  meter_.add_step(tokens, flops, step_clock.seconds());
  step_clock.reset();
  t_.logger->heartbeat(n);
  const AfterStep next = after_step(cadence_, {n, epoch, b_index == per_epoch_ - 1});
  if (next.log) log_step(n, epoch);
  saved_at_step_ = false;
  if (next.save) {
    health_.flush();
    saved_at_step_ = save_now(epoch);
  }
  // --stream-max-gb: the samples consumed since the last checkpoint fill half the budget; a
  // checkpoint acknowledges them and gives the producers room.
  if (!saved_at_step_ && t_.stream_wants_checkpoint()) {
    FSDP_LOG0(kInfo) << "--stream-max-gb: saving step " << n
                     << " to acknowledge the samples consumed since the last checkpoint";
    health_.flush();
    saved_at_step_ = save_now(epoch);
  }
  if (next.evaluate) evaluate_at(n, epoch);
  if (next.evaluate_after_epoch) deferred_eval_step_ = n;
  // Agree on stopping: a signal may have reached only some ranks.
  const AfterSignal on_signal = after_signal(t_.topo.any_rank(stop_requested()), saved_at_step_);
  if (on_signal.stop) {
    FSDP_LOG0(kWarn) << "stop requested (signal " << stop_signal() << "): saving at step " << n
                     << " and exiting";
    health_.flush();
    if (on_signal.save) save_or_fail(epoch, "stopped by signal");
    saved_at_step_ = true;
    result_.stopped_by_signal = true;
  }
  maybe_kill_for_test(n, t_.topo.rank());
  return next.stop || on_signal.stop;
}

void TrainLoop::log_step(int64_t n, int64_t epoch) {
  int64_t tokens = 0;
  auto scalars = window_.report(t_.topo.metrics(), "train", &tokens);
  const double secs = window_clock_.seconds();
  // Where the window's time went (docs/usage.md "Time breakdown"): read after the metric
  // reduction above, which waited for the steps, so device timings are complete.
  const PhaseTimer::Seconds phases = timer_.take();
  TimeAccumulator shares;
  shares.add("data", loader_.take_data_wait_seconds());
  shares.add("forward", phases.phase[PhaseTimer::kForward]);
  shares.add("backward", phases.phase[PhaseTimer::kBackward]);
  shares.add("optimizer", phases.phase[PhaseTimer::kOptimizer]);
  shares.add("comm", phases.comm);
  scalars.emplace_back("train/lr", last_lr_);
  health_.flush();
  scalars.emplace_back("train/grad_norm", health_.last_grad_norm());
  scalars.emplace_back("train/epoch", static_cast<double>(epoch));
  for (auto& kv : t_.stream_scalars()) scalars.push_back(std::move(kv));
  scalars.emplace_back("perf/tokens_per_s", secs > 0 ? tokens / secs : 0.0);
  if (auto mfu = meter_.mfu()) scalars.emplace_back("perf/mfu", *mfu);
  scalars.emplace_back("perf/eta_s", meter_.eta_seconds(cadence_.stop_at - n));
  scalars.emplace_back("perf/step_time_s",
                       meter_.window_steps() ? secs / meter_.window_steps() : 0.0);
  const int64_t steps = std::max<int64_t>(meter_.window_steps(), 1);
  // Micro-batches per optimizer step on this rank (fewer with --packing; every rank runs as many).
  scalars.emplace_back(
      "perf/micro_batches_per_step",
      static_cast<double>(runner_.take_micro_batches()) / static_cast<double>(steps));
  // Feature bytes this rank read per step (with sequence parallelism over native shards, its
  // slice of each sample: docs/usage.md "Sequence parallelism").
  scalars.emplace_back("perf/read_mib_per_step",
                       static_cast<double>(read_bytes_) / 1048576.0 / static_cast<double>(steps));
  read_bytes_ = 0;
  for (const auto& [k, v] : metrics::time_shares(shares, secs)) {
    scalars.emplace_back("perf/" + k + "_share", v);
    scalars.emplace_back("perf/" + k + "_s", v * secs / static_cast<double>(steps));
  }
  const auto mem = metrics::peak_memory(t_.topo.device());
  scalars.emplace_back("mem/host_peak_rss_gib", mem.host_peak_rss_bytes / 1073741824.0);
  if (mem.device_peak_allocated_bytes >= 0) {
    scalars.emplace_back("mem/device_peak_allocated_gib",
                         mem.device_peak_allocated_bytes / 1073741824.0);
  }
  t_.logger->log(n, scalars);
  if (!evaluates_ && n > kZeroMetricWarmupSteps) {
    const std::string stuck = train_zero_.observe(scalars);
    if (!stuck.empty()) FSDP_LOG0(kError) << stuck;
  }
  meter_.reset_window();
  window_clock_.reset();
}

void TrainLoop::end_epoch(int64_t epoch, const EpochCounts& counts) {
  // The next run starts at the following epoch.
  t_.state.epoch = epoch + 1;
  t_.state.position = 0;
  auto em = epoch_metrics_.report(t_.topo.metrics(), "train_epoch");
  report_zero_loss(epoch, counts, em);
  t_.logger->log(t_.state.step, em);
  const AfterEpoch next = after_epoch(cadence_, epoch);
  if (next.save) {
    health_.flush();
    saved_at_step_ = save_now(epoch);
  }
  if (deferred_eval_step_ > 0) {
    evaluate_at(deferred_eval_step_, epoch);
    deferred_eval_step_ = 0;
  }
  if (next.evaluate) {
    evaluate_at(t_.state.step, epoch);
    result_.final_eval = last_eval_;
  }
}

void TrainLoop::report_zero_loss(int64_t epoch, const EpochCounts& c,
                                 std::vector<std::pair<std::string, double>>& em) {
  at::Tensor sums = at::tensor({c.zero_loss, c.loss_tokens, c.batches}, at::kLong);
  t_.topo.reduce_counts(sums, comm::ReduceOp::kSum);
  const int64_t zero = sums[0].item<int64_t>(), loss_tokens = sums[1].item<int64_t>();
  em.emplace_back("train_epoch/zero_loss_samples", static_cast<double>(zero));
  if (loss_tokens == 0 && sums[2].item<int64_t>() > 0) {
    FSDP_LOG0(kWarn) << "epoch " << epoch << " had no loss tokens at all (" << zero
                     << " samples, each with an all-zero loss mask): it trained nothing; "
                     << "check the features' loss masks (docs/data.md 'Loss masks')";
  } else if (zero > 0) {
    FSDP_LOG0(kInfo) << "epoch " << epoch << ": " << zero
                     << " sample(s) without a loss token (they train nothing)";
  }
}

void TrainLoop::finish() {
  health_.flush();
  if (profiler_) profiler_->finish();
  switch (final_save(t_.cfg.checkpoint.save_final, saved_at_step_, t_.state.step)) {
    case FinalSave::kSave:
      save_or_fail(t_.state.epoch, "training finished");
      break;
    case FinalSave::kWarnUnsaved:
      FSDP_LOG0(kWarn) << "--save-final false: the weights of step " << t_.state.step
                       << " are not saved";
      break;
    case FinalSave::kNone:
      // The newest step is in a checkpoint already: at a stream's end, the arrivals it will
      // never train (an incomplete last round) are acknowledged with it.
      if (saved_at_step_ && loader_.stream_ended()) t_.acknowledge_stream();
      break;
  }
  if (t_.topo.is_root()) {
    const std::string bad = loader_.bad_sample_summary();
    if (!bad.empty()) FSDP_LOG0(kWarn) << bad;
  }
  t_.log_stream_end();
  t_.logger->close();
  result_.steps = t_.state.step;
}

bool TrainLoop::save_now(int64_t epoch) {
  // A periodic save that fails leaves training running: the next save tries again.
  t_.state.epoch_metric_sums = epoch_metrics_.global_sums(t_.topo.metrics());
  const std::string dir = t_.save(epoch);
  if (dir.empty()) return false;
  result_.last_checkpoint = dir;
  last_saved_step_ = t_.state.step;
  last_saved_dir_ = dir;
  return true;
}

void TrainLoop::save_or_fail(int64_t epoch, const char* when) {
  if (save_now(epoch)) return;
  throw CheckpointWriteError(
      fsdp::str(when, ": the checkpoint of step ", t_.state.step,
                " could not be written (see the error above); ",
                t_.checkpointer.newest_checkpoint_text()),
      "free space in --output-dir (or choose another) and run again with --resume", __FILE__,
      __LINE__);
}

void TrainLoop::save_before_failure(int64_t epoch, const char* why) {
  health_.flush();
  if (t_.state.step > 0 && !saved_at_step_) {
    FSDP_LOG0(kWarn) << why << ": saving step " << t_.state.step
                     << " first (after fixing the cause, --resume continues from it)";
    saved_at_step_ = save_now(epoch);
  }
}

void TrainLoop::evaluate_at(int64_t at, int64_t epoch) {
  if (last_eval_step_ == at) return;
  // Unreadable evaluation data ends the run like a bad training sample: the last completed step
  // is saved first.
  last_eval_ = t_.evaluator->evaluate(
      "eval", [&] { save_before_failure(epoch_now_, "evaluation data failed"); });
  last_eval_step_ = at;
  t_.logger->log(at, last_eval_);
  const std::string stuck = eval_zero_.observe(last_eval_);
  if (!stuck.empty()) FSDP_LOG0(kError) << stuck;
  keep_best(epoch);
}

void TrainLoop::keep_best(int64_t epoch) {
  if (!keeps_best_) return;
  // Rank 0 decides (the evaluation's scalars are the same on every rank, all-reduced), every
  // rank follows: a save is collective.
  std::optional<double> better;
  if (best_) better = best_->improvement(last_eval_);
  if (!t_.topo.any_rank(better.has_value())) return;
  const int64_t step = t_.state.step;
  // The checkpoint of the evaluated step: the one just saved (the loop saves before it
  // evaluates), else one saved now; a best is always a complete checkpoint of its own.
  if (last_saved_step_ != step) {
    health_.flush();
    if (save_now(epoch)) {
      saved_at_step_ = true;
    } else {
      if (best_) {
        FSDP_LOG0(kWarn) << "--save-best-by " << best_->metric().name << ": step " << step
                         << " is a new best (" << *better
                         << "), but its checkpoint could not be saved; the best stays "
                         << (best_->best() ? best_->best()->checkpoint : std::string("unset"));
      }
      return;
    }
  }
  if (!best_) return;
  const auto before = best_->best();
  const auto ref =
      checkpoint::parse_checkpoint_name(std::filesystem::path(last_saved_dir_).filename().string());
  try {
    best_->record(*better, step, ref ? ref->epoch : epoch, last_saved_dir_);
    FSDP_LOG0(kInfo) << "new best " << best_->metric().name << " " << *better
                     << (before ? fsdp::str(" (was ", before->value, " at step ", before->step, ")")
                                : std::string())
                     << ": "
                     << checkpoint::join_path(t_.checkpointer.output_dir(), checkpoint::kBestLink)
                     << " -> " << last_saved_dir_;
    // The earlier best, no longer protected, goes when it is beyond --keep-last.
    t_.checkpointer.prune(last_saved_dir_);
  } catch (const std::exception& e) {
    FSDP_LOG0(kWarn) << "--save-best-by: the new best " << last_saved_dir_
                     << " could not be recorded: " << error_text(e);
  }
}

RunResult Trainer::Impl::train() {
  install_stop_handlers();
  auto loader = spool
                    ? make_stream_loader(cfg, topo, plan, stream_positions(), algo->sample_layout())
                    : make_feature_loader(cfg, topo, plan, train_ds, algo->sample_layout(),
                                          /*training=*/true);
  if (cfg.data.noise_std > 0) {
    FSDP_LOG0(kInfo) << "noise augmentation: " << config::to_string(cfg.data.noise_type)
                     << (cfg.data.noise_type == config::NoiseType::kUniform ? " U(-s, s)"
                                                                            : " N(0, s^2)")
                     << ", s = " << cfg.data.noise_std
                     << ", on the aux hidden states of training samples";
  }
  const int64_t per_epoch = loader->batches_per_epoch();
  const int64_t steps_per_epoch = check_epoch(per_epoch);
  total_steps =
      cfg.loop.total_steps ? *cfg.loop.total_steps : cfg.loop.num_epochs * steps_per_epoch;
  // A metric no evaluation can log is an error now, not after hours of training.
  const std::optional<BestMetric> best_by =
      parse_best_metric(cfg.checkpoint.save_best_by, cfg.model.ttt_length);
  checkpoint::ensure_directory(cfg.checkpoint.output_dir);
  state.world_size = topo.dp_world();  // the data layout (sequence-parallel groups read one sample)
  state.accumulation_steps = plan.accumulation_steps;
  state.micro_batch_size = plan.micro_batch;
  state.config_json = config_json;
  resume_if_asked();
  if (spool && !checkpointer.resuming()) check_stream_fresh();
  state.launch_id = launch_attempt().launch_id;  // the checkpoints of this launch carry it
  if (!cfg.loop.total_steps && state.total_steps > 0) {
    // The schedule's length comes from the checkpoint (the learning rate continues where it
    // was); say when this run's epochs end elsewhere (another --num-epochs, another layout).
    warn_resumed_schedule(per_epoch, steps_per_epoch);
    total_steps = state.total_steps;
  }
  state.total_steps = total_steps;
  warmup = warmup_steps(cfg, total_steps);
  const int64_t stop_at =
      cfg.loop.max_steps ? std::min(*cfg.loop.max_steps, total_steps) : total_steps;
  if (topo.is_root()) log_run_start(per_epoch);
  TrainLoop loop(*this, *loader, per_epoch, make_cadence(cfg, eval_ds != nullptr, stop_at),
                 best_by);
  return loop.run();
}

int64_t Trainer::Impl::check_epoch(int64_t per_epoch) const {
  const int dp_world = topo.dp_world();
  FSDP_USAGE_CHECK(per_epoch > 0,
                   fsdp::str("training data (", train_ds->root(), ") has ", train_ds->size(),
                             " samples: fewer than one micro-batch (", plan.micro_batch,
                             ") per data-parallel rank (", dp_world, ")"),
                   "use more samples, fewer ranks or a smaller --draft-micro-batch-size");
  const int64_t accum = plan.accumulation_steps;
  FSDP_USAGE_CHECK(
      accum <= per_epoch,
      fsdp::str("--draft-global-batch-size ", cfg.loop.draft_global_batch_size, " needs ", accum,
                " micro-batches per rank for one optimizer step, but an epoch of ",
                train_ds->size(), " samples gives ", per_epoch, " per rank (", dp_world,
                " data-parallel ranks, ", "micro-batch ", plan.micro_batch, ")"),
      fsdp::str("use a global batch of at most ", per_epoch * plan.micro_batch * dp_world,
                " (every step would otherwise average fewer samples than it divides by)"));
  if (per_epoch % accum != 0) {
    FSDP_LOG0(kWarn) << "each epoch ends with an optimizer step of " << per_epoch % accum << " of "
                     << accum << " micro-batches (" << per_epoch
                     << " per rank per epoch): its loss is still divided by " << accum
                     << ", as in SpecForge, so that step's gradient is " << per_epoch % accum << "/"
                     << accum << " as large; a global batch that divides the epoch avoids it";
  }
  return (per_epoch + accum - 1) / accum;
}

void Trainer::Impl::warn_resumed_schedule(int64_t per_epoch, int64_t steps_per_epoch) const {
  const int64_t accum = plan.accumulation_steps;
  const int64_t saved_total = state.total_steps;
  int64_t end_step = state.step;
  if (state.epoch < cfg.loop.num_epochs) {
    end_step += (per_epoch - state.position + accum - 1) / accum +
                (cfg.loop.num_epochs - state.epoch - 1) * steps_per_epoch;
  }
  if (end_step > saved_total) {
    FSDP_LOG0(kWarn) << "--num-epochs " << cfg.loop.num_epochs << " runs to step " << end_step
                     << ", but the resumed run's learning-rate schedule has " << saved_total
                     << " steps: training ends at step " << saved_total
                     << " (the schedule's end); to train to step " << end_step
                     << ", pass --total-steps " << end_step;
  } else if (end_step < std::min(saved_total, cfg.loop.max_steps.value_or(saved_total))) {
    const int64_t more = (saved_total - end_step + steps_per_epoch - 1) / steps_per_epoch;
    FSDP_LOG0(kWarn) << "--num-epochs " << cfg.loop.num_epochs << " ends at step " << end_step
                     << " on this data-parallel layout, before the end of the resumed run's "
                     << "learning-rate schedule (" << saved_total << " steps; the learning "
                     << "rate will not have decayed): to finish the schedule pass --num-epochs "
                     << cfg.loop.num_epochs + more << " --max-steps " << saved_total
                     << " (or --total-steps " << end_step << " to end it at step " << end_step
                     << ", which changes the learning rate from here on)";
  }
}

void Trainer::Impl::log_run_start(int64_t per_epoch) const {
  config::write_run_config(cfg);  // checked: a full disk is an error naming the file
  FSDP_LOG0(kInfo) << "draft: " << algo->describe_parameters() << "; "
                   << (spool
                           ? fsdp::str("a stream from ", spool->options().dir, " (up to ",
                                       per_epoch * plan.micro_batch * topo.dp_world(), " samples)")
                           : fsdp::str(train_ds->size(), " training samples (", train_ds->format(),
                                       ")"))
                   << ", " << per_epoch << " micro-batches per rank per epoch, accumulation "
                   << plan.accumulation_steps << ", " << total_steps << " optimizer steps (warmup "
                   << warmup << ")";
  // What the sharding costs each rank before any activation: the first thing to know when a
  // larger model or more ranks is planned.
  const auto mem = algo->engine().memory();
  FSDP_LOG0(kInfo) << "sharded state per rank: "
                   << metrics::format_bytes(mem.persistent_device_bytes) << " on "
                   << metrics::device_name(topo.device())
                   << (mem.persistent_host_bytes > 0
                           ? " + " + metrics::format_bytes(mem.persistent_host_bytes) +
                                 " in host memory (--cpu-offload; the optimizer step on " +
                                 std::to_string(optim::host_loop_threads()) + " CPU thread(s))"
                           : std::string());
}

}  // namespace fsdp::train
