// The optimisation loop (spec section 6): epochs of micro-batches in sampler order, gradient
// accumulation, the warmup-cosine schedule, clipping and the non-finite guard in the engine's
// step, logging every --log-steps, evaluation and saving at their intervals, stop on signal.
// Everything here is collective: every rank runs the same steps in the same order.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <fstream>
#include <optional>
#include <thread>

#include "checkpoint/checkpoint_dir.h"
#include "comm/runtime.h"
#include "config/run_config.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loss_mask_stats.h"
#include "metrics/meters.h"
#include "metrics/profiler.h"
#include "model/flops.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/signals.h"
#include "train/step_health.h"
#include "train/step_metrics.h"
#include "train/trainer_impl.h"

namespace fsdp::train {

namespace {
double comm_seconds(const shard::ShardEngine& engine) {
  double s = 0;
  const auto& g = engine.groups();
  if (g.shard) s += g.shard->stats().total_seconds();
  if (g.replicate && g.replicate != g.shard) s += g.replicate->stats().total_seconds();
  return s;
}
}  // namespace

RunResult Trainer::Impl::train() {
  install_stop_handlers();
  auto loader = make_loader(train_ds, /*shuffle=*/true);
  const int64_t per_epoch = loader->batches_per_epoch();
  FSDP_USAGE_CHECK(per_epoch > 0,
                   fsdp::str("training data (", train_ds->root(), ") has ", train_ds->size(),
                             " samples: fewer than one micro-batch (", plan.micro_batch,
                             ") per rank (", world, " ranks)"),
                   "use more samples, fewer ranks or a smaller --draft-micro-batch-size");
  const int64_t accum = plan.accumulation_steps;
  FSDP_USAGE_CHECK(
      accum <= per_epoch,
      fsdp::str("--draft-global-batch-size ", cfg.loop.draft_global_batch_size, " needs ", accum,
                " micro-batches per rank for one optimizer step, but an epoch of ",
                train_ds->size(), " samples gives ", per_epoch, " per rank (", world, " ranks, ",
                "micro-batch ", plan.micro_batch, ")"),
      fsdp::str("use a global batch of at most ", per_epoch * plan.micro_batch * world,
                " (every step would otherwise average fewer samples than it divides by)"));
  const int64_t steps_per_epoch = (per_epoch + accum - 1) / accum;
  if (per_epoch % accum != 0) {
    FSDP_LOG0(kWarn) << "each epoch ends with an optimizer step of " << per_epoch % accum << " of "
                     << accum << " micro-batches (" << per_epoch
                     << " per rank per epoch): its loss is still divided by " << accum
                     << ", as in SpecForge, so that step's gradient is " << per_epoch % accum << "/"
                     << accum << " as large; a global batch that divides the epoch avoids it";
  }
  total_steps =
      cfg.loop.total_steps ? *cfg.loop.total_steps : cfg.loop.num_epochs * steps_per_epoch;
  checkpoint::ensure_directory(cfg.checkpoint.output_dir);
  state.world_size = world;
  state.accumulation_steps = accum;
  state.micro_batch_size = plan.micro_batch;
  state.config_json = config_json;
  resume_if_asked();
  state.launch_id = launch_attempt().launch_id;  // the checkpoints of this launch carry it
  if (!cfg.loop.total_steps && state.total_steps > 0) {
    // The schedule's length comes from the checkpoint (the learning rate continues where it
    // was); say when this run's epochs end elsewhere (another --num-epochs, another layout).
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
    total_steps = saved_total;
  }
  state.total_steps = total_steps;
  warmup = cfg.optim.warmup_steps ? *cfg.optim.warmup_steps
                                  : optim::warmup_steps(cfg.optim.warmup_ratio, total_steps);
  // Warmup, then cosine (spec 6), linear or constant: pure functions of the 1-based step.
  const double base_lr = cfg.optim.learning_rate;
  auto learning_rate_at = [&](int64_t n) {
    switch (cfg.optim.lr_scheduler) {
      case config::LrScheduler::kCosine:
        return optim::warmup_cosine_lr(base_lr, n, total_steps, warmup);
      case config::LrScheduler::kLinear:
        if (n <= warmup) return base_lr * static_cast<double>(n) / static_cast<double>(warmup);
        return base_lr * static_cast<double>(std::max<int64_t>(total_steps - n, 0)) /
               static_cast<double>(std::max<int64_t>(total_steps - warmup, 1));
      case config::LrScheduler::kConstant:
        if (n <= warmup) return base_lr * static_cast<double>(n) / static_cast<double>(warmup);
        return base_lr;
    }
    return base_lr;
  };
  const int64_t stop_at =
      cfg.loop.max_steps ? std::min(*cfg.loop.max_steps, total_steps) : total_steps;

  if (rank == 0) {
    config::write_run_config(cfg);  // checked: a full disk is an error naming the file
    const auto counts = model::count_parameters(draft_cfg);
    FSDP_LOG0(kInfo) << "draft: " << counts.trainable << " trainable parameters (+"
                     << counts.frozen_embedding << " frozen embedding); " << train_ds->size()
                     << " training samples (" << train_ds->format() << "), " << per_epoch
                     << " micro-batches per rank per epoch, accumulation " << accum << ", "
                     << total_steps << " optimizer steps (warmup " << warmup << ")";
    // What the sharding costs each rank before any activation: the first thing to know when a
    // larger model or more ranks is planned.
    const auto mem = engine->memory();
    FSDP_LOG0(kInfo) << "sharded state per rank: "
                     << metrics::format_bytes(mem.persistent_device_bytes) << " on "
                     << metrics::device_name(device)
                     << (mem.persistent_host_bytes > 0
                             ? " + " + metrics::format_bytes(mem.persistent_host_bytes) +
                                   " in host memory (--cpu-offload; the optimizer step on " +
                                   std::to_string(optim::host_loop_threads()) + " CPU thread(s))"
                             : std::string());
  }
  metrics::SinkContext sc;
  sc.rank = rank;
  sc.total_steps = total_steps;
  sc.output_dir = cfg.checkpoint.output_dir;
  sc.config_json = config_json;
  sc.wandb_run_id = state.wandb_run_id;  // from the checkpoint resumed from, if any
  // Also a fresh start (step 0): records of an earlier attempt that saved nothing move aside.
  sc.resumed_step = state.step;
  sc.tensorboard_resumed_step = state.step > 0 || launch_attempt().attempt > 0 ? state.step : -1;
  logger = metrics::make_logger(cfg.metrics, sc);
  // Kept when this part of the run has no W&B sink: a later resume with W&B continues the run.
  if (const std::string id = logger->wandb_run_id(); !id.empty()) state.wandb_run_id = id;
  metrics::ThroughputMeter meter(metrics::resolve_peak_tflops(cfg.metrics.mfu_peak_tflops, device));
  StepMetrics window(cfg.model.ttt_length, metrics_device()),
      epoch_metrics(cfg.model.ttt_length, metrics_device());
  // A resume inside an epoch: the epoch's metrics so far (rank 0 holds them; report() sums ranks).
  if (rank == 0 && state.position > 0) epoch_metrics.add_sums(state.epoch_metric_sums);
  TimeAccumulator shares;
  const auto loss_opts = loss_options(accum);

  RunResult result;
  // A periodic save that fails leaves training running: the next save tries again.
  auto save_now = [&](int64_t epoch) {
    state.epoch_metric_sums = epoch_metrics.global_sums(*metrics_comm);
    const std::string dir = save(epoch);
    if (!dir.empty()) result.last_checkpoint = dir;
    return !dir.empty();
  };
  // A save that ends the run must succeed, else the run fails naming what is left.
  auto save_or_fail = [&](int64_t epoch, const char* when) {
    if (save_now(epoch)) return;
    throw CheckpointWriteError(
        fsdp::str(when, ": the checkpoint of step ", state.step,
                  " could not be written (see the error above); ", newest_checkpoint_text()),
        "free space in --output-dir (or choose another) and run again with --resume", __FILE__,
        __LINE__);
  };
  if (state.step >= stop_at) {
    // Nothing left to train. A fresh run with --max-steps 0 exports the initial draft (the
    // starting point of parity checks against other trainers).
    if (state.step == 0) {
      save_or_fail(state.epoch, "exporting the initial draft");
    } else {
      FSDP_LOG0(kInfo) << "already at step " << state.step << " (stop at " << stop_at
                       << "): nothing to train";
    }
    logger->close();
    result.steps = state.step;
    return result;
  }
  // Skipped steps and the gradient norm: read at logging steps, saves and the end when the
  // engine keeps its step scalars on the device (no host synchronisation per step).
  StepHealth health(kMaxConsecutiveNonFinite, &state.skipped_steps);
  Stopwatch window_clock;
  double window_comm0 = comm_seconds(*engine);
  double last_lr = 0;
  bool stop = false;
  // Just resumed: that step is saved already (a stop before the next step saves nothing again).
  bool saved_at_step = !resume_candidates.empty() && state.step > 0;
  int64_t deferred_eval_step = 0;  // an --eval-steps evaluation waiting for the epoch-end save
  // One evaluation per step: an epoch end that is also an --eval-steps multiple evaluates once.
  std::vector<std::pair<std::string, double>> last_eval;
  int64_t last_eval_step = -1;
  int64_t epoch_now = 0;  // the epoch a failed evaluation's save is named after
  auto evaluate_at = [&](int64_t at) {
    if (last_eval_step == at) return;
    // Unreadable evaluation data ends the run like a bad training sample: the last completed
    // step is saved first.
    last_eval = evaluate("eval", [&] {
      health.flush();
      if (state.step > 0 && !saved_at_step) {
        FSDP_LOG0(kWarn) << "evaluation data failed: saving step " << state.step
                         << " first (after fixing the cause, --resume continues from it)";
        saved_at_step = save_now(epoch_now);
      }
    });
    last_eval_step = at;
    logger->log(at, last_eval);
  };
  std::unique_ptr<metrics::StepProfiler> profiler;
  if (cfg.profile.enabled) profiler = std::make_unique<metrics::StepProfiler>(profiler_options());

  for (int64_t epoch = state.epoch; epoch < cfg.loop.num_epochs && !stop; ++epoch) {
    epoch_now = epoch;
    loader->start({epoch, epoch == state.epoch ? state.position : 0});
    int64_t in_group = 0;
    std::vector<model::StepOutput> group_outputs;  // this optimizer step's micro-batches
    double step_flops = 0;
    int64_t step_tokens = 0;
    // This rank's samples without a loss token, and loss tokens, in the epoch (this run's part).
    int64_t epoch_zero_loss = 0, epoch_loss_tokens = 0, epoch_batches = 0;
    Stopwatch step_clock;
    while (!stop) {
      if (profiler && in_group == 0) profiler->before_step(state.step + 1);
      // A bad sample (without --skip-bad-samples) stops the run on every rank, after saving the
      // last completed step: fixing or removing the file and --resume lose nothing. The ranks
      // agree on it here, before the micro-batch's collectives (one CPU flag per micro-batch).
      // Other loader failures (memory, a file system gone) get the same save before the exit.
      std::optional<data::Batch> batch;
      std::exception_ptr bad_sample;
      bool is_bad_sample = false;
      try {
        batch = loader->next();
      } catch (const data::BadSampleError&) {
        bad_sample = std::current_exception();
        is_bad_sample = true;
      } catch (const std::exception&) {
        bad_sample = std::current_exception();
      }
      if (world > 1 ? any_rank(bad_sample != nullptr) : bad_sample != nullptr) {
        health.flush();
        if (state.step > 0 && !saved_at_step) {
          FSDP_LOG0(kWarn) << (is_bad_sample ? "a bad sample stops the run"
                               : bad_sample  ? "the data loader failed"
                                             : "data loading failed on another rank")
                           << ": saving step " << state.step
                           << " first (after fixing the cause, --resume continues from it)";
          saved_at_step = save_now(epoch);
        }
        if (bad_sample) std::rethrow_exception(bad_sample);
        stop_for_other_rank("data loading");
      }
      if (!batch) break;
      ++epoch_batches;
      epoch_zero_loss += data::zero_loss_rows(*batch);
      epoch_loss_tokens += batch->num_loss_tokens();
      const int64_t b_index = batch->batch_index;
      const bool last_in_group = in_group == accum - 1 || b_index == per_epoch - 1;
      engine->set_sync_gradients(!cfg.shard.accumulate_locally || last_in_group);
      step_tokens += batch->attention_mask.sum().item<int64_t>();
      // Loss rows from the host copy of loss_mask: no device sync (see model::LossRows).
      const auto rows = model::LossRows::build(batch->loss_mask, cfg.model.ttt_length, device);
      step_flops += model::count_step_flops(draft_cfg, batch->batch_size(), batch->seq_len(),
                                            cfg.model.ttt_length, rows.count)
                        .total();
      // fsdp:: scopes name the phases in --profile traces (free when not profiling).
      auto out = [&] {
        RECORD_USER_SCOPE("fsdp::forward");
        return model::ttt_step(
            *draft, head, rows, batch->input_ids.to(device, true),
            batch->attention_mask.to(device, true), batch->loss_mask.to(device, true),
            batch->aux_hidden.to(device, true), batch->target_hidden.to(device, true), loss_opts);
      }();
      {
        RECORD_USER_SCOPE("fsdp::backward");
        out.loss.backward();
      }
      // Counted when the optimizer step completes: a checkpoint's metric sums then cover
      // exactly the steps it holds (a bad sample can stop the run inside a step).
      out.loss = at::Tensor();
      group_outputs.push_back(std::move(out));
      ++in_group;
      if (!last_in_group) continue;
      for (const auto& o : group_outputs) {
        window.add(o);
        epoch_metrics.add(o);
      }
      group_outputs.clear();

      // One optimizer step.
      const int64_t n = state.step + 1;
      last_lr = learning_rate_at(n);
      {
        RECORD_USER_SCOPE("fsdp::optimizer_step");
        health.add(engine->step(last_lr, cfg.optim.max_grad_norm), n);
      }
      state.step = n;
      state.epoch = epoch;
      state.position = b_index + 1;
      in_group = 0;
      if (profiler) profiler->after_step(n);
      meter.add_step(step_tokens, step_flops, step_clock.seconds());
      step_flops = 0;
      step_tokens = 0;
      step_clock.reset();
      logger->heartbeat(n);
      if (n % cfg.metrics.log_steps == 0 || n == stop_at) {
        int64_t tokens = 0;
        auto scalars = window.report(*metrics_comm, "train", &tokens);
        const double secs = window_clock.seconds();
        shares.reset();
        shares.add("data", loader->take_data_wait_seconds());
        const double comm_now = comm_seconds(*engine);
        shares.add("comm", comm_now - window_comm0);
        window_comm0 = comm_now;
        scalars.emplace_back("train/lr", last_lr);
        health.flush();
        scalars.emplace_back("train/grad_norm", health.last_grad_norm());
        scalars.emplace_back("train/epoch", static_cast<double>(epoch));
        scalars.emplace_back("perf/tokens_per_s", secs > 0 ? tokens / secs : 0.0);
        if (auto mfu = meter.mfu()) scalars.emplace_back("perf/mfu", *mfu);
        scalars.emplace_back("perf/eta_s", meter.eta_seconds(stop_at - n));
        scalars.emplace_back("perf/step_time_s",
                             meter.window_steps() ? secs / meter.window_steps() : 0.0);
        for (const auto& [k, v] : metrics::time_shares(shares, secs)) {
          scalars.emplace_back("perf/" + k + "_share", v);
        }
        const auto mem = metrics::peak_memory(device);
        scalars.emplace_back("mem/host_peak_rss_gib", mem.host_peak_rss_bytes / 1073741824.0);
        if (mem.device_peak_allocated_bytes >= 0) {
          scalars.emplace_back("mem/device_peak_allocated_gib",
                               mem.device_peak_allocated_bytes / 1073741824.0);
        }
        logger->log(n, scalars);
        meter.reset_window();
        window_clock.reset();
      }
      saved_at_step = false;
      // Saves come before evaluations: a bad evaluation sample must not cost the checkpoint.
      // The last step of an epoch whose end saves anyway is saved once, there (with the
      // position at the start of the next epoch).
      const bool epoch_end_saves = b_index == per_epoch - 1 && cfg.checkpoint.save_interval > 0 &&
                                   (epoch + 1) % cfg.checkpoint.save_interval == 0;
      if (cfg.checkpoint.save_steps > 0 && n % cfg.checkpoint.save_steps == 0 && !epoch_end_saves) {
        health.flush();
        saved_at_step = save_now(epoch);
      }
      if (cfg.eval.eval_steps > 0 && n % cfg.eval.eval_steps == 0 && eval_ds) {
        if (epoch_end_saves) {
          deferred_eval_step = n;  // after that save (below)
        } else {
          evaluate_at(n);
        }
      }
      // Agree on stopping: a signal may have reached only some ranks.
      if (any_rank(stop_requested())) {
        FSDP_LOG0(kWarn) << "stop requested (signal " << stop_signal() << "): saving at step " << n
                         << " and exiting";
        health.flush();
        if (!saved_at_step) save_or_fail(epoch, "stopped by signal");
        saved_at_step = true;
        result.stopped_by_signal = true;
        stop = true;
      }
      if (n >= stop_at) stop = true;
      maybe_kill_for_test(n, rank);
    }
    if (result.stopped_by_signal) break;
    const bool epoch_done = loader->state().position >= per_epoch || !stop;
    if (!epoch_done) break;  // stopped by max steps inside the epoch
    // End of epoch: the next run starts at the following epoch.
    state.epoch = epoch + 1;
    state.position = 0;
    auto em = epoch_metrics.report(*metrics_comm, "train_epoch");
    {
      at::Tensor counts =
          at::tensor({epoch_zero_loss, epoch_loss_tokens, epoch_batches}, at::kLong);
      if (world > 1) control->all_reduce(counts, comm::ReduceOp::kSum)->wait();
      const int64_t zero = counts[0].item<int64_t>(), loss_tokens = counts[1].item<int64_t>();
      em.emplace_back("train_epoch/zero_loss_samples", static_cast<double>(zero));
      if (loss_tokens == 0 && counts[2].item<int64_t>() > 0) {
        FSDP_LOG0(kWarn) << "epoch " << epoch << " had no loss tokens at all (" << zero
                         << " samples, each with an all-zero loss mask): it trained nothing; "
                         << "check the features' loss masks (docs/data.md 'Loss masks')";
      } else if (zero > 0) {
        FSDP_LOG0(kInfo) << "epoch " << epoch << ": " << zero
                         << " sample(s) without a loss token (they train nothing)";
      }
    }
    logger->log(state.step, em);
    if (cfg.checkpoint.save_interval > 0 && (epoch + 1) % cfg.checkpoint.save_interval == 0) {
      health.flush();
      saved_at_step = save_now(epoch);
    }
    if (deferred_eval_step > 0) {
      evaluate_at(deferred_eval_step);
      deferred_eval_step = 0;
    }
    if (eval_ds && cfg.eval.eval_interval > 0 && (epoch + 1) % cfg.eval.eval_interval == 0) {
      evaluate_at(state.step);
      result.final_eval = last_eval;
    }
  }
  health.flush();
  if (profiler) profiler->finish();
  if (cfg.checkpoint.save_final && !saved_at_step && state.step > 0) {
    save_or_fail(state.epoch, "training finished");
  } else if (!saved_at_step && state.step > 0) {
    FSDP_LOG0(kWarn) << "--save-final false: the weights of step " << state.step
                     << " are not saved";
  }
  if (rank == 0) {
    const std::string bad = loader->bad_sample_summary();
    if (!bad.empty()) {
      FSDP_LOG0(kWarn) << bad;
    }
  }
  logger->close();
  result.steps = state.step;
  return result;
}

}  // namespace fsdp::train
