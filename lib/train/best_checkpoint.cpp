// The best checkpoint of a run (see best_checkpoint.h).
#include "train/best_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace fsdp::train {

std::optional<BestMetric> parse_best_metric(const std::string& value, int64_t ttt_length) {
  if (value == "none") return std::nullopt;
  const std::string hint =
      "give a metric an evaluation logs, e.g. eval/accept_len (the default), eval/acc_0, "
      "eval/simulated_acc_len or eval/loss, or none to keep no best checkpoint";
  FSDP_USAGE_CHECK(!value.empty(), "--save-best-by is empty", hint);
  BestMetric m;
  m.name = value.find('/') == std::string::npos ? "eval/" + value : value;
  FSDP_USAGE_CHECK(m.name.rfind("eval/", 0) == 0 && m.name.size() > 5,
                   "--save-best-by " + value +
                       ": the best checkpoint is decided at each evaluation, by one of its "
                       "metrics (eval/...)",
                   hint);
  const std::string base = m.name.substr(5);
  FSDP_USAGE_CHECK(base != "zero_loss_samples",
                   "--save-best-by " + value + " is a count of samples, not a measure of the draft",
                   hint);
  static const std::regex per_step(R"(^.*_(\d{1,9})$)");
  std::smatch match;
  if (std::regex_match(base, match, per_step)) {
    const int64_t i = std::stoll(match[1].str());
    FSDP_USAGE_CHECK(i < ttt_length,
                     fsdp::str("--save-best-by ", value, ": the evaluation logs TTT steps 0..",
                               ttt_length - 1, " (--ttt-length ", ttt_length, ")"),
                     fsdp::str("use a step below ", ttt_length, ", e.g. ",
                               match.str(0).substr(0, match.position(1)), "0"));
  }
  m.minimise = m.name.find("loss") != std::string::npos;
  return m;
}

std::string best_record_json(const BestRecord& r) {
  nlohmann::json j;
  j["metric"] = r.metric;
  j["direction"] = r.direction;
  j["step"] = r.step;
  j["epoch"] = r.epoch;
  j["value"] = r.value;
  j["checkpoint"] = r.checkpoint;
  return j.dump(1) + "\n";
}

void write_best_record(const std::string& output_dir, const BestRecord& r) {
  const std::string file = checkpoint::join_path(output_dir, kBestRecordFile);
  const std::string temp =
      checkpoint::join_path(output_dir, std::string(".") + kBestRecordFile + ".tmp");
  write_file_durably(temp, best_record_json(r));
  FSDP_CHECK(std::rename(temp.c_str(), file.c_str()) == 0, "cannot rename " + temp + " to " + file,
             "check the permissions of --output-dir");
  fsync_file(output_dir);
}

std::optional<BestRecord> read_best_record(const std::string& output_dir) {
  const std::string file = checkpoint::join_path(output_dir, kBestRecordFile);
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  BestRecord r;
  try {
    FSDP_CHECK(j.is_object(), "not a JSON object", "remove it to start the best checkpoint anew");
    r.metric = j.at("metric").get<std::string>();
    r.direction = j.at("direction").get<std::string>();
    r.step = j.at("step").get<int64_t>();
    r.epoch = j.at("epoch").get<int64_t>();
    r.value = j.at("value").get<double>();
    r.checkpoint = j.at("checkpoint").get<std::string>();
  } catch (const std::exception& e) {
    FSDP_FAIL(file + " cannot be read: " + e.what(), "remove it to start the best checkpoint anew");
  }
  return r;
}

BestTracker::BestTracker(std::string output_dir, BestMetric metric)
    : output_dir_(std::move(output_dir)), metric_(std::move(metric)) {}

std::string BestTracker::resume() {
  std::optional<BestRecord> saved;
  try {
    saved = read_best_record(output_dir_);
  } catch (const std::exception& e) {
    return fsdp::str("--save-best-by: ", error_text(e), "; the best starts anew");
  }
  if (!saved) return "";
  if (saved->metric != metric_.name) {
    return fsdp::str("--save-best-by ", metric_.name, ": ", kBestRecordFile,
                     " records the best by ", saved->metric, " (", saved->checkpoint,
                     "); the best by ", metric_.name,
                     " starts anew and replaces it at the next evaluation");
  }
  const auto ref = checkpoint::parse_checkpoint_name(saved->checkpoint);
  const std::string dir = ref ? checkpoint::join_path(output_dir_, saved->checkpoint) : "";
  if (!ref || !checkpoint::is_complete(dir)) {
    return fsdp::str("--save-best-by ", metric_.name, ": the best recorded in ", kBestRecordFile,
                     " (", saved->checkpoint, ") is not a complete checkpoint of ", output_dir_,
                     " (set aside as another branch, or removed); the best starts anew");
  }
  best_ = *saved;
  if (checkpoint::link_target(output_dir_, checkpoint::kBestLink) != saved->checkpoint) {
    checkpoint::point_link(output_dir_, checkpoint::kBestLink, dir);
  }
  return fsdp::str("--save-best-by ", metric_.name, ": the best so far is ", saved->checkpoint,
                   " (", metric_.name, " ", saved->value, " at step ", saved->step, ")");
}

std::optional<double> BestTracker::improvement(const MetricScalars& eval) {
  const auto it = std::find_if(eval.begin(), eval.end(),
                               [&](const auto& kv) { return kv.first == metric_.name; });
  if (it == eval.end()) {
    if (!warned_missing_) {
      std::string names;
      for (const auto& kv : eval) names += (names.empty() ? "" : ", ") + kv.first;
      FSDP_LOG0(kWarn) << "--save-best-by " << metric_.name
                       << ": the evaluation does not log this metric (it logs " << names
                       << "): no best checkpoint is kept until it does; pass one of those, or "
                          "none";
      warned_missing_ = true;
    }
    return std::nullopt;
  }
  const double v = it->second;
  if (std::isnan(v)) return std::nullopt;
  if (best_ && !(metric_.minimise ? v < best_->value : v > best_->value)) return std::nullopt;
  return v;
}

void BestTracker::record(double value, int64_t step, int64_t epoch,
                         const std::string& checkpoint_dir) {
  BestRecord r;
  r.metric = metric_.name;
  r.direction = metric_.direction();
  r.step = step;
  r.epoch = epoch;
  r.value = value;
  r.checkpoint = fs::path(checkpoint_dir).filename().string();
  best_ = r;
  write_best_record(output_dir_, r);
  checkpoint::point_link(output_dir_, checkpoint::kBestLink, checkpoint_dir);
}

}  // namespace fsdp::train
