// Checkpoint directories of a run: naming (epoch_<E>_step_<S>), discovery of the newest
// complete one, atomic publication (write into a temporary directory, completion marker last,
// rename), keep-last-k pruning and safe permissions, and the names of the files inside one (the
// layout below). Pure filesystem code: it never knows what the files inside mean, and never
// deletes a directory it did not recognise as a checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::checkpoint {

// Written last into a checkpoint directory: its presence means every file is complete.
inline constexpr const char* kCompleteMarker = "COMPLETE";
// Symbolic links in the output directory naming the best (--save-best-by) and the newest
// checkpoint. Their names never parse as a checkpoint's, so discovery, resume and pruning
// never take a link for a checkpoint; the temporary links point_link() renames over them
// (".best.tmp", ".latest.tmp") are ignored alike.
inline constexpr const char* kBestLink = "best";
inline constexpr const char* kLatestLink = "latest";

// The layout of a checkpoint directory (docs/reference.md §7): the draft export the engines read
// (config.json, model.safetensors; aux_layers.json when the features' layers are known; a LoRA
// run's lora.json and PEFT adapter/), then what resume reads (train_state/ of the sharding
// engine, trainer_state.json of the loop), then the marker. Every reader and writer takes the
// names from here.
namespace layout {
inline constexpr const char* kConfig = "config.json";
inline constexpr const char* kModel = "model.safetensors";
inline constexpr const char* kAuxLayers = "aux_layers.json";
inline constexpr const char* kLoraRecord = "lora.json";
inline constexpr const char* kAdapterDir = "adapter";
inline constexpr const char* kTrainState = "train_state";
inline constexpr const char* kRunState = "trainer_state.json";
// Inside train_state/: the shard manifest (written by lib/shard; named here for messages).
inline constexpr const char* kShardManifest = "manifest.txt";
}  // namespace layout

struct CheckpointRef {
  std::string path;  // absolute or as given under the output directory
  int64_t epoch = 0;
  int64_t step = 0;
};

// "epoch_<E>_step_<S>".
std::string checkpoint_name(int64_t epoch, int64_t step);
// Parses a checkpoint directory name; nullopt when it is not one.
std::optional<CheckpointRef> parse_checkpoint_name(const std::string& name);

// Complete checkpoints under output_dir, oldest first (by step, then epoch). Directories
// without the marker (interrupted saves) and temporary directories are ignored.
std::vector<CheckpointRef> list_complete(const std::string& output_dir);
// The newest complete checkpoint, if any.
std::optional<CheckpointRef> find_latest(const std::string& output_dir);
// Draft exports under output_dir that are not fsdp-train checkpoints: directories named
// epoch_<E> or epoch_<E>_step_<S> without the completion marker that hold config.json and
// model.safetensors (what SpecForge saves), sorted by name. Resume cannot continue them (no
// optimizer state); --init-checkpoint can start from their weights.
std::vector<std::string> list_foreign_exports(const std::string& output_dir);
// True when `dir` holds the completion marker.
bool is_complete(const std::string& dir);

// Creates `dir` (and parents) with owner-only write permissions (0750), or checks that it is
// a writable directory. Throws UsageError naming the directory.
void ensure_directory(const std::string& dir);

// Rank-0 side of a save. begin() makes a fresh temporary directory under output_dir
// (".tmp_<name>"), whose files the caller writes; commit() writes the marker (fsynced), renames
// the directory to its final name (replacing an older checkpoint of the same name) and prunes
// complete checkpoints beyond keep_last (0 keeps all). A crash at any point leaves either the
// previous checkpoints untouched or a temporary directory that discovery ignores and the next
// begin() removes.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string output_dir, int64_t epoch, int64_t step);
  const std::string& temp_dir() const { return temp_dir_; }
  const std::string& final_dir() const { return final_dir_; }
  void begin();
  std::string commit(int64_t keep_last);

 private:
  std::string output_dir_;
  std::string temp_dir_;
  std::string final_dir_;
};

// Removes complete checkpoints beyond the newest keep_last (never the one named `keep`, nor the
// one the <output_dir>/best link points at: the best is kept besides the newest keep_last).
// Returns the removed paths.
std::vector<std::string> prune(const std::string& output_dir, int64_t keep_last,
                               const std::string& keep = "");

// Renames every complete checkpoint under output_dir whose step is above `step` to
// "<name>.superseded" (".superseded-2", ... when taken): a run resumed from an older checkpoint
// continues another branch, and the abandoned one must neither be overwritten by its saves nor
// be taken by a later --resume auto. Nothing is deleted. Returns the new paths.
std::vector<std::string> set_aside_newer(const std::string& output_dir, int64_t step);

// Tidies what interrupted saves left in output_dir (call with the OutputDirLock held, before
// reading checkpoints): a "<name>.old" whose <name> is missing is the earlier checkpoint of a
// same-name replacement cut short and is put back; other ".old" and ".tmp_*" directories are
// removed. Returns one line per action.
std::vector<std::string> recover_interrupted_saves(const std::string& output_dir);

// An exclusive advisory lock (flock) on <output_dir>/.fsdp-train.lock, held while the object
// lives and released by the kernel when the process ends in any way (a crash included), so a
// stale lock never blocks a restart. acquire() returns "" when this process holds it, else a
// description of the holder ("pid 123 on host a1, since 2026-11-30 14:02:11") read from the
// file. On a file system without flock support the lock is skipped (acquire() returns "" and
// held() is false).
class OutputDirLock {
 public:
  explicit OutputDirLock(std::string output_dir) : dir_(std::move(output_dir)) {}
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;
  std::string acquire();
  bool held() const { return fd_ >= 0; }

 private:
  std::string dir_;
  int fd_ = -1;
};

// Points <output_dir>/<link_name> at `checkpoint_dir` (a checkpoint directly in output_dir),
// replacing an earlier link atomically: a temporary link ".<link_name>.tmp" is made and renamed
// over it, so a reader sees the old target or the new one, never none. The link is relative
// (the directory's name): the output directory can be moved or mounted elsewhere. Throws Error
// when the link cannot be made (a file system without symbolic links, a directory of that name).
void point_link(const std::string& output_dir, const std::string& link_name,
                const std::string& checkpoint_dir);
// The name of the directory <output_dir>/<link_name> points at; "" when it is not a link.
std::string link_target(const std::string& output_dir, const std::string& link_name);

// Joins path components without doubling separators; rejects components containing ".." or a
// leading '/', so names derived from configs cannot escape the directory.
std::string join_path(const std::string& dir, const std::string& name);

}  // namespace fsdp::checkpoint
