// trainer_state.json and RNG state files (train/run_state.h).
#include "train/run_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/fs_util.h"

namespace fsdp::train {

void save_run_state(const std::string& dir, const RunState& s) {
  nlohmann::json j;
  j["format_version"] = kRunStateVersion;
  j["step"] = s.step;
  j["epoch"] = s.epoch;
  j["position"] = s.position;
  j["total_steps"] = s.total_steps;
  j["world_size"] = s.world_size;
  j["accumulation_steps"] = s.accumulation_steps;
  j["micro_batch_size"] = s.micro_batch_size;
  j["skipped_steps"] = s.skipped_steps;
  if (!s.launch_id.empty()) j["launch_id"] = s.launch_id;
  if (!s.wandb_run_id.empty()) j["wandb_run_id"] = s.wandb_run_id;
  if (!s.mlflow_run_id.empty()) j["mlflow_run_id"] = s.mlflow_run_id;
  if (!s.epoch_metric_sums.empty()) j["epoch_metric_sums"] = s.epoch_metric_sums;
  j["config"] = s.config_json.empty() ? nlohmann::json::object()
                                      : nlohmann::json::parse(s.config_json, nullptr, false);
  const std::string path = checkpoint::join_path(dir, checkpoint::layout::kRunState);
  write_file_durably(path, j.dump(2) + "\n");
  auto gen = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  const std::string rng_path = checkpoint::join_path(dir, "rng_state.bin");
  write_file_durably(rng_path, rng.data_ptr(), rng.nbytes());
}

RunState load_run_state(const std::string& dir, bool restore_rng) {
  const std::string path = checkpoint::join_path(dir, checkpoint::layout::kRunState);
  std::ifstream f(path);
  FSDP_USAGE_CHECK(f.good(), "cannot read '" + path + "'",
                   "the checkpoint holds no training state (an export only?); resume from a "
                   "checkpoint written by a training run, or use --init-checkpoint");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  FSDP_USAGE_CHECK(!j.is_discarded() && j.is_object(), "'" + path + "' is not valid JSON",
                   "the checkpoint is corrupt; resume from an older one");
  FSDP_USAGE_CHECK(j.value("format_version", -1) == kRunStateVersion,
                   fsdp::str("'", path, "' has format version ", j.value("format_version", -1),
                             ", this build reads ", kRunStateVersion),
                   "resume with the fsdp-train version that wrote it");
  RunState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.position = j.at("position").get<int64_t>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.world_size = j.at("world_size").get<int64_t>();
    s.accumulation_steps = j.at("accumulation_steps").get<int64_t>();
    s.micro_batch_size = j.at("micro_batch_size").get<int64_t>();
    s.skipped_steps = j.value("skipped_steps", int64_t{0});
    s.launch_id = j.value("launch_id", std::string());
    s.wandb_run_id = j.value("wandb_run_id", std::string());
    s.mlflow_run_id = j.value("mlflow_run_id", std::string());
    if (j.contains("epoch_metric_sums") && j["epoch_metric_sums"].is_array()) {
      s.epoch_metric_sums = j["epoch_metric_sums"].get<std::vector<double>>();
    }
    if (j.contains("config")) s.config_json = j["config"].dump();
  } catch (const nlohmann::json::exception& e) {
    FSDP_USAGE_FAIL("'" + path + "' lacks a field: " + e.what(),
                    "the checkpoint is corrupt; resume from an older one");
  }
  const std::string rng_path = checkpoint::join_path(dir, "rng_state.bin");
  std::ifstream r(rng_path, std::ios::binary);
  if (restore_rng && r.good()) {
    std::stringstream rs;
    rs << r.rdbuf();
    const std::string bytes = rs.str();
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    at::Tensor cur = gen.get_state();
    FSDP_USAGE_CHECK(bytes.size() == cur.nbytes(),
                     "'" + rng_path + "' has " + std::to_string(bytes.size()) +
                         " bytes, expected " + std::to_string(cur.nbytes()),
                     "the checkpoint was written by another LibTorch; resume without it");
    at::Tensor st = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(st.data_ptr(), bytes.data(), bytes.size());
    gen.set_state(st);
  }
  return s;
}

}  // namespace fsdp::train
