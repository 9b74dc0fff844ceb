// Draft export write/read (checkpoint/export.h).
#include "checkpoint/export.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/block_draft_contract.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export_check.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "model/draft_model.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace fsdp::checkpoint {

uint64_t write_draft_export(const std::string& dir, const std::string& config_json,
                            const std::map<std::string, at::Tensor>& full_state,
                            const at::Tensor& d2t, const at::Tensor& t2d, c10::ScalarType dtype,
                            bool with_embedding) {
  ensure_directory(dir);
  {
    const std::string path = join_path(dir, layout::kConfig);
    write_file_durably(
        path, config_json.empty() || config_json.back() != '\n' ? config_json + "\n" : config_json);
  }
  NamedTensors tensors;
  for (const auto& [name, t] : full_state) {  // std::map: sorted by name
    if (name == "embed_tokens.weight" && !with_embedding) continue;
    tensors.emplace_back(name, t.detach().to(at::kCPU).to(dtype).contiguous());
  }
  FSDP_CHECK(d2t.defined() && t2d.defined(), "export needs the vocabulary mapping (d2t, t2d)",
             "this is a bug in fsdp-train: please report it with the command line and log");
  tensors.emplace_back("d2t", d2t.to(at::kCPU).to(at::kLong).contiguous());
  tensors.emplace_back("t2d", t2d.to(at::kCPU).to(at::kBool).contiguous());
  const uint64_t bytes = write_safetensors(join_path(dir, layout::kModel), tensors,
                                           {{"format", "pt"}, {"producer", "fsdp-train"}});
  // What the serving engines need, checked on the files as written (headers, d2t and t2d only:
  // milliseconds for any draft) before the caller can mark the checkpoint complete.
  verify_export(dir);
  return bytes;
}

uint64_t write_block_draft_export(const std::string& dir, const nlohmann::json& config,
                                  const std::map<std::string, at::Tensor>& full_state,
                                  c10::ScalarType dtype) {
  NamedTensors tensors;
  for (const auto& x : block_draft_layout(config)) {
    auto it = full_state.find(x.name);
    FSDP_CHECK(it != full_state.end() && it->second.sizes().vec() == x.shape,
               "block draft export: tensor " + x.name +
                   (it == full_state.end() ? std::string(" missing from the model")
                                           : " of shape " + json(it->second.sizes().vec()).dump() +
                                                 ", config.json implies " + json(x.shape).dump()),
               "this is a bug in fsdp-train: please report it with the draft config");
    tensors.emplace_back(x.name, it->second.detach().to(at::kCPU).to(dtype).contiguous());
  }
  ensure_directory(dir);
  write_file_durably(join_path(dir, layout::kConfig), config.dump(2) + "\n");
  const uint64_t bytes = write_safetensors(join_path(dir, layout::kModel), tensors,
                                           {{"format", "pt"}, {"producer", "fsdp-train"}});
  verify_export(dir);
  return bytes;
}

std::pair<at::Tensor, at::Tensor> read_export_mapping(const std::string& dir) {
  const std::string model = join_path(dir, layout::kModel);
  std::error_code ec;
  FSDP_USAGE_CHECK(fs::is_regular_file(model, ec), "'" + model + "' is missing",
                   "the directory is not a draft export; point at an epoch_<E>_step_<S> directory");
  auto file = SafetensorsFile::open(model);
  std::pair<at::Tensor, at::Tensor> out;
  for (const auto& info : file->tensors()) {
    if (info.name == "d2t") out.first = file->read(info.name).to(at::kLong);
    if (info.name == "t2d") out.second = file->read(info.name).to(at::kBool);
  }
  return out;
}

DraftExport read_draft_export(const std::string& dir) {
  std::error_code ec;
  FSDP_USAGE_CHECK(fs::is_directory(dir, ec), "checkpoint directory '" + dir + "' does not exist",
                   "give a directory holding config.json and model.safetensors (an "
                   "epoch_<E>_step_<S> directory written by fsdp-train)");
  const std::string model = join_path(dir, layout::kModel);
  FSDP_USAGE_CHECK(fs::is_regular_file(model, ec), "'" + model + "' is missing",
                   "the directory is not a draft export; point at an epoch_<E>_step_<S> directory");
  DraftExport out;
  out.config_path = join_path(dir, layout::kConfig);
  auto file = SafetensorsFile::open(model);
  for (const auto& info : file->tensors()) {
    at::Tensor t = file->read(info.name);
    if (info.name == "d2t") {
      out.d2t = t.to(at::kLong);
    } else if (info.name == "t2d") {
      out.t2d = t.to(at::kBool);
    } else {
      out.weights[info.name] = t;
    }
  }
  return out;
}

std::string lora_record_json(const LoraRecord& r) {
  nlohmann::ordered_json j;
  j["rank"] = r.rank;
  j["alpha"] = r.alpha;
  j["targets"] = r.targets;
  j["base"] = r.base;
  return j.dump(2) + "\n";
}

std::optional<LoraRecord> read_lora_record(const std::string& dir) {
  const std::string path = join_path(dir, layout::kLoraRecord);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  LoraRecord r;
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    r.rank = j.at("rank").get<int64_t>();
    r.alpha = j.at("alpha").get<double>();
    r.targets = j.at("targets").get<std::vector<std::string>>();
    r.base = j.value("base", std::string());
  } catch (const std::exception& e) {
    FSDP_USAGE_FAIL("'" + path + "' is not a LoRA record: " + e.what(),
                    "the checkpoint is damaged; use another one");
  }
  FSDP_USAGE_CHECK(r.rank >= 1 && r.alpha > 0, "'" + path + "': rank and alpha must be positive",
                   "the checkpoint is damaged; use another one");
  return r;
}

void write_peft_adapter(const std::string& dir, const std::map<std::string, at::Tensor>& adapters,
                        const LoraRecord& r, c10::ScalarType dtype) {
  ensure_directory(dir);
  NamedTensors tensors;
  for (const auto& [name, t] : adapters)
    tensors.emplace_back("base_model.model." + name,
                         t.detach().to(at::kCPU).to(dtype).contiguous());
  write_safetensors(join_path(dir, "adapter_model.safetensors"), tensors, {{"format", "pt"}});
  nlohmann::ordered_json c;
  c["peft_type"] = "LORA";
  c["base_model_name_or_path"] = r.base;
  c["r"] = r.rank;
  c["lora_alpha"] = r.alpha;
  c["target_modules"] = r.targets;
  c["lora_dropout"] = 0.0;
  c["bias"] = "none";
  c["fan_in_fan_out"] = false;
  c["use_rslora"] = false;
  c["inference_mode"] = true;
  c["task_type"] = nullptr;
  write_file_durably(join_path(dir, "adapter_config.json"), c.dump(2) + "\n");
}

void write_checkpoint_export(const std::string& dir, std::map<std::string, at::Tensor>& full_state,
                             const CheckpointExport& e) {
  if (e.block_draft) {
    write_block_draft_export(dir, nlohmann::json::parse(e.config_json), full_state, e.dtype);
    return;
  }
  if (e.lora) {
    if (e.lora_adapters) {
      std::map<std::string, at::Tensor> adapters;
      for (const auto& [name, t] : full_state)
        if (model::is_lora_tensor(name)) adapters.emplace(name, t);
      write_peft_adapter(join_path(dir, layout::kAdapterDir), adapters, *e.lora, e.dtype);
    }
    model::merge_lora(full_state, e.lora->scale());
    write_file_durably(join_path(dir, layout::kLoraRecord), lora_record_json(*e.lora));
  }
  if (e.rename) {
    std::map<std::string, at::Tensor> renamed;
    for (auto& [name, t] : full_state) renamed.emplace(e.rename(name), std::move(t));
    full_state.swap(renamed);
  }
  write_draft_export(dir, e.config_json, full_state, e.d2t, e.t2d, e.dtype, e.trained_embedding);
  // Inside the checkpoint's temporary directory: published with it, never half-written.
  if (!e.aux_layers_record.empty())
    write_file_durably(join_path(dir, layout::kAuxLayers), e.aux_layers_record);
}

}  // namespace fsdp::checkpoint
