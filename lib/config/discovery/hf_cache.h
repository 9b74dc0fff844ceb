// Hugging Face repository ids as --target-model-path (SpecForge's scripts pass
// "meta-llama/Llama-3.1-8B-Instruct"): found in the local Hugging Face cache that
// huggingface_hub / transformers download into. Never downloads; only reads directories and
// refs/main.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fsdp::config {

struct TrainConfig;

// True for "org/name" shaped text: one '/', letters, digits, '.', '_', '-' (no leading '.' or
// '/'), i.e. what cannot be meant as a local path when no such directory exists.
bool looks_like_repo_id(const std::string& text);

// The hub caches searched, in order: SpecForge's --model-download-dir (from_pretrained's
// cache_dir), $HF_HUB_CACHE, $HF_HOME/hub, $TRANSFORMERS_CACHE, $XDG_CACHE_HOME/huggingface/hub,
// ~/.cache/huggingface/hub (unset variables left out).
std::vector<std::string> hub_cache_dirs(const std::string& model_download_dir);

// <cache>/models--<org>--<name>/snapshots/<refs/main> in the first cache that has the repo (the
// only snapshot when refs/main is missing). nullopt when none has it; fsdp::UsageError when a
// cache has several snapshots and no refs/main to choose.
std::optional<std::string> find_hub_snapshot(const std::string& repo_id,
                                             const std::vector<std::string>& caches);

// When --target-model-path is no directory but a repo id found in a cache: replaces it with the
// snapshot directory and returns a line saying so; else changes nothing and returns "".
std::string resolve_hub_target(TrainConfig* cfg);

// The hint for a --target-model-path that is neither a directory nor a cached repo id.
std::string hub_target_hint(const TrainConfig& cfg);

}  // namespace fsdp::config
