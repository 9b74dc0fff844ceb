// Hugging Face cache lookup of repository ids (hf_cache.h).
#include "config/discovery/hf_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "config/train_config.h"
#include "core/env.h"
#include "core/error.h"

namespace fsdp::config {
namespace {
namespace fs = std::filesystem;

std::string env_path(const char* name) {
  return env::text(name).value_or("");
}

// SpecForge's --model-download-dir, recorded among its no-effect flags ("" when not given).
std::string model_download_dir(const TrainConfig& cfg) {
  const auto it = cfg.specforge_flags.find("model-download-dir");
  return it == cfg.specforge_flags.end() ? "" : it->second;
}

std::string joined(const std::vector<std::string>& dirs) {
  std::string s;
  for (const auto& d : dirs) s += (s.empty() ? "" : ", ") + d;
  return s;
}
}  // namespace

bool looks_like_repo_id(const std::string& text) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == text.size() ||
      text.find('/', slash + 1) != std::string::npos || text[0] == '.' || text[slash + 1] == '.')
    return false;
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '.' || c == '_' ||
          c == '-'))
      return false;
  return true;
}

std::vector<std::string> hub_cache_dirs(const std::string& model_download_dir) {
  std::vector<std::string> out;
  const auto add = [&](const std::string& d) {
    if (!d.empty() && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  };
  add(model_download_dir);
  add(env_path("HF_HUB_CACHE"));
  if (!env_path("HF_HOME").empty()) add(env_path("HF_HOME") + "/hub");
  add(env_path("TRANSFORMERS_CACHE"));
  if (!env_path("XDG_CACHE_HOME").empty()) add(env_path("XDG_CACHE_HOME") + "/huggingface/hub");
  if (!env_path("HOME").empty()) add(env_path("HOME") + "/.cache/huggingface/hub");
  return out;
}

std::optional<std::string> find_hub_snapshot(const std::string& repo_id,
                                             const std::vector<std::string>& caches) {
  const std::string folder = "models--" + repo_id.substr(0, repo_id.find('/')) + "--" +
                             repo_id.substr(repo_id.find('/') + 1);
  for (const auto& cache : caches) {
    const fs::path repo = fs::path(cache) / folder;
    std::error_code ec;
    if (!fs::is_directory(repo / "snapshots", ec)) continue;
    std::string main;
    if (std::ifstream ref(repo / "refs" / "main"); ref >> main) {
      const fs::path snap = repo / "snapshots" / main;
      FSDP_USAGE_CHECK(fs::is_directory(snap, ec),
                       str(repo.string(), "/refs/main names snapshot ", main,
                           ", which is not there (an interrupted download?)"),
                       str("download ", repo_id,
                           " again, or pass a snapshot directory as "
                           "--target-model-path"));
      return snap.string();
    }
    std::vector<std::string> snaps;
    for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
      if (e.is_directory()) snaps.push_back(e.path().string());
    if (snaps.size() == 1) return snaps[0];
    FSDP_USAGE_CHECK(
        snaps.empty(),
        str(repo.string(), " holds ", snaps.size(), " snapshots and no refs/main to choose one"),
        str("pass the one to train against as --target-model-path, e.g. ", snaps[0]));
  }
  return std::nullopt;
}

std::string resolve_hub_target(TrainConfig* cfg) {
  const std::string target = cfg->model.target_model_path;  // a copy: replaced below
  std::error_code ec;
  if (target.empty() || fs::exists(target, ec) || !looks_like_repo_id(target)) return "";
  const auto snap = find_hub_snapshot(target, hub_cache_dirs(model_download_dir(*cfg)));
  if (!snap) return "";
  cfg->model.target_model_path = *snap;
  return str("--target-model-path ", target, ": the Hugging Face cache's snapshot ", *snap);
}

std::string hub_target_hint(const TrainConfig& cfg) {
  const std::string& repo_id = cfg.model.target_model_path;
  return str(
      "it is no local directory and no downloaded copy of the Hugging Face repository "
      "is in the caches searched (",
      joined(hub_cache_dirs(model_download_dir(cfg))),
      "); fsdp-train does not download: run `huggingface-cli download ", repo_id,
      " --include '*.json' '*.safetensors'` (only config.json and the tensors of the "
      "embedding and LM head are read), or pass the local directory");
}

}  // namespace fsdp::config
