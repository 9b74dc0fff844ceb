// The Trainer's side of a stream (docs/data.md "Streaming"): the spool opened with the run's
// layout, the record each checkpoint keeps of what it consumed, acknowledgement (deletion) once a
// checkpoint is complete, the budget's early checkpoints and the checks a resume makes. The spool
// itself (ledger, scanner, budget file) is data/spool.h; the loop only calls in here.
#include "train/trainer.h"
#include "train/trainer_impl.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "train/signals.h"

namespace fsdp::train {

namespace {

constexpr const char* kStreamRecord = "stream.json";

}  // namespace

// A stream is trained once, to --total-steps at most, from one spool read whole: checked at
// start-up, before any data or weights are read.
void Trainer::Impl::check_stream_options() const {
  FSDP_USAGE_CHECK(cfg.loop.total_steps.has_value(),
                   "--stream without --total-steps: a stream's length is not known in advance, "
                   "and the learning-rate schedule and warm-up need one",
                   "give --total-steps (the schedule's length; the run ends there, or earlier "
                   "at END_OF_STREAM)");
  FSDP_USAGE_CHECK(
      cfg.loop.num_epochs == 1,
      fsdp::str("--stream with --num-epochs ", cfg.loop.num_epochs, ": a stream is read once"),
      "use --stream-uses K to train each sample K times, and drop --num-epochs");
  FSDP_USAGE_CHECK(cfg.loop.sp_ulysses_size == 1,
                   "--stream with --sp-ulysses-size: sequence parallelism does not read from a "
                   "spool yet",
                   "stream without --sp-ulysses-size, or convert the samples and train offline");
}

void Trainer::Impl::open_stream() {
  data::SpoolOptions so;
  so.dir = cfg.data.train_hidden_states_path;
  so.owner = std::filesystem::absolute(cfg.checkpoint.output_dir).lexically_normal().string();
  so.budget_bytes = static_cast<uint64_t>(std::llround(cfg.data.stream_max_gb * 1073741824.0));
  so.settle_seconds = cfg.data.stream_settle_s;
  so.order.uses = cfg.data.stream_uses;
  so.order.replay_window = cfg.data.stream_replay_window;
  so.order.round = plan.micro_batch * topo.dp_world();
  so.order.seed = static_cast<uint64_t>(cfg.loop.seed);
  so.dataset = algo->dataset_options();
  so.scans = topo.is_root();
  so.interrupted = [] { return stop_requested(); };
  install_stop_handlers();  // a signal while the first samples are awaited stops the wait
  spool = std::make_shared<data::Spool>(so);
  topo.control().barrier();  // rank 0 has started the ledger
  FSDP_LOG0(kInfo) << "--stream: waiting for " << cfg.data.stream_start_samples << " samples in "
                   << so.dir << " (the start-up checks read them)";
  train_ds = spool->first_arrivals(cfg.data.stream_start_samples);
}

namespace {

// Positions of the stream one run can train: --total-steps' worth.
int64_t stream_capacity(const config::TrainConfig& cfg, const config::BatchPlan& plan, int dp) {
  return *cfg.loop.total_steps * plan.accumulation_steps * plan.micro_batch * dp;
}

}  // namespace

std::shared_ptr<data::FeatureDataset> Trainer::Impl::stream_positions() const {
  return std::make_shared<data::SpoolDataset>(spool, stream_capacity(cfg, plan, topo.dp_world()));
}

int64_t Trainer::Impl::stream_consumed() const {
  // The epoch (the one pass over the stream) done: every position up to --total-steps' worth, or
  // to the stream's end when that came first (the order caps it there).
  if (state.epoch >= 1) return stream_capacity(cfg, plan, topo.dp_world());
  return state.position * plan.micro_batch * topo.dp_world();
}

void Trainer::Impl::write_stream_record(const std::string& dir) const {
  const int64_t consumed = stream_consumed();
  const data::Spool::Stats st = spool->stats();
  nlohmann::json j;
  j["spool"] = spool->options().dir;
  j["finished"] = state.epoch >= 1;
  j["consumed_positions"] = consumed;
  j["arrivals_acknowledged"] = spool->order().acknowledged(consumed, st.arrivals, st.ended);
  j["arrivals_in_ledger"] = st.arrivals;
  j["uses"] = spool->order().options().uses;
  j["replay_window"] = spool->order().options().replay_window;
  write_file_durably(checkpoint::join_path(dir, kStreamRecord), j.dump(2) + "\n");
}

void Trainer::Impl::acknowledge_stream() const {
  if (!spool || !topo.is_root()) return;
  spool->acknowledge(stream_consumed());
}

void Trainer::Impl::check_stream_resume(const std::string& loaded) const {
  const std::string path = checkpoint::join_path(loaded, kStreamRecord);
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(),
                   "--stream: " + loaded + " has no " + kStreamRecord +
                       ": it is not a checkpoint of a streaming run",
                   "resume it without --stream, or start the streaming run in a new --output-dir");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  FSDP_USAGE_CHECK(j.is_object() && j.contains("uses") && j.contains("replay_window"),
                   path + ": unreadable stream record", "resume from another checkpoint");
  const auto& o = spool->order().options();
  FSDP_USAGE_CHECK(
      j["uses"].get<int64_t>() == o.uses && j["replay_window"].get<int64_t>() == o.replay_window,
      fsdp::str("--stream: ", loaded, " was trained with --stream-uses ", j["uses"].get<int64_t>(),
                " and --stream-replay-window ", j["replay_window"].get<int64_t>(),
                "; this run asks for ", o.uses, " and ", o.replay_window),
      "resume with the checkpoint's values: they define which sample each position "
      "of the stream trains");
  if (j.value("spool", std::string()) != spool->options().dir) {
    FSDP_LOG0(kWarn) << "--stream: " << loaded << " read the spool " << j.value("spool", "")
                     << "; this run reads " << spool->options().dir
                     << " (the same directory under another path is fine)";
  }
  if (topo.is_root()) {
    spool->check_resumable(stream_consumed(), loaded);
    // A save acknowledged before the process died may not have deleted its samples yet.
    acknowledge_stream();
  }
}

void Trainer::Impl::check_stream_fresh() const {
  if (!topo.is_root()) return;
  const data::Spool::Stats st = spool->stats();
  FSDP_USAGE_CHECK(st.acknowledged == 0,
                   fsdp::str("--stream: the spool ", spool->options().dir, " already acknowledged ",
                             st.acknowledged, " samples of a run, but --output-dir ",
                             cfg.checkpoint.output_dir, " has no checkpoint to resume"),
                   "resume the run with the output directory that holds its checkpoints, or give "
                   "this run an empty spool");
}

bool Trainer::Impl::stream_wants_checkpoint() const {
  if (!spool || cfg.data.stream_max_gb <= 0) return false;
  const bool mine = topo.is_root() && spool->wants_checkpoint(stream_consumed());
  return topo.any_rank(mine);
}

std::vector<std::pair<std::string, double>> Trainer::Impl::stream_scalars() const {
  if (!spool || !topo.is_root()) return {};
  const data::Spool::Stats st = spool->stats();
  return {{"stream/arrived", static_cast<double>(st.arrivals)},
          {"stream/acknowledged", static_cast<double>(st.acknowledged)},
          {"stream/spool_gib", static_cast<double>(st.used_bytes) / 1073741824.0},
          {"stream/spool_peak_gib", static_cast<double>(st.peak_bytes) / 1073741824.0}};
}

void Trainer::Impl::log_stream_end() const {
  if (!spool || !topo.is_root()) return;
  const data::Spool::Stats st = spool->stats();
  FSDP_LOG0(kInfo) << "--stream: " << st.arrivals << " samples arrived"
                   << (st.ended ? " (the stream ended)" : " (the stream goes on)") << ", "
                   << st.acknowledged << " acknowledged and deleted; the spool held at most "
                   << static_cast<double>(st.peak_bytes) / 1073741824.0 << " GiB"
                   << (cfg.data.stream_max_gb > 0
                           ? fsdp::str(" (budget ", cfg.data.stream_max_gb, " GiB)")
                           : std::string());
}

}  // namespace fsdp::train
