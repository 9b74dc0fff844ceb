// Checkpoint directory management (checkpoint/checkpoint_dir.h).
#include "checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace fsdp::checkpoint {

namespace {
void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

std::string checkpoint_name(int64_t epoch, int64_t step) {
  return "epoch_" + std::to_string(epoch) + "_step_" + std::to_string(step);
}

std::optional<CheckpointRef> parse_checkpoint_name(const std::string& name) {
  static const std::regex re(R"(^epoch_(\d{1,12})_step_(\d{1,15})$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  CheckpointRef r;
  r.epoch = std::stoll(m[1].str());
  r.step = std::stoll(m[2].str());
  return r;
}

bool is_complete(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kCompleteMarker, ec);
}

std::vector<CheckpointRef> list_complete(const std::string& output_dir) {
  std::vector<CheckpointRef> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    if (!entry.is_directory()) continue;
    auto ref = parse_checkpoint_name(entry.path().filename().string());
    if (!ref || !is_complete(entry.path().string())) continue;
    ref->path = entry.path().string();
    out.push_back(*ref);
  }
  std::sort(out.begin(), out.end(), [](const CheckpointRef& a, const CheckpointRef& b) {
    return a.step != b.step ? a.step < b.step : a.epoch < b.epoch;
  });
  return out;
}

std::vector<std::string> list_foreign_exports(const std::string& output_dir) {
  static const std::regex re(R"(^epoch_\d{1,12}(_step_\d{1,15})?$)");
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !std::regex_match(name, re)) continue;
    const std::string dir = entry.path().string();
    if (is_complete(dir) || !fs::is_regular_file(entry.path() / layout::kConfig, ec) ||
        !fs::is_regular_file(entry.path() / layout::kModel, ec)) {
      continue;
    }
    out.push_back(dir);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<CheckpointRef> find_latest(const std::string& output_dir) {
  auto all = list_complete(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

void ensure_directory(const std::string& dir) {
  FSDP_USAGE_CHECK(!dir.empty(), "an output directory is empty", "set --output-dir");
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    FSDP_USAGE_CHECK(!ec, "cannot create directory '" + dir + "': " + ec.message(),
                     "check --output-dir and the permissions of its parent");
    fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec,
                    fs::perm_options::replace, ec);
  }
  FSDP_USAGE_CHECK(fs::is_directory(dir, ec), "'" + dir + "' exists and is not a directory",
                   "point --output-dir at a directory");
  FSDP_USAGE_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0,
                   "directory '" + dir + "' is not writable",
                   "fix its permissions or choose another --output-dir");
}

std::string join_path(const std::string& dir, const std::string& name) {
  FSDP_CHECK(!name.empty() && name.front() != '/' && name.find("..") == std::string::npos,
             "refusing path component '" + name + "' under '" + dir + "'",
             "generated names must stay inside their directory");
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

CheckpointWriter::CheckpointWriter(std::string output_dir, int64_t epoch, int64_t step)
    : output_dir_(std::move(output_dir)) {
  const std::string name = checkpoint_name(epoch, step);
  temp_dir_ = join_path(output_dir_, ".tmp_" + name);
  final_dir_ = join_path(output_dir_, name);
}

void CheckpointWriter::begin() {
  ensure_directory(output_dir_);
  std::error_code ec;
  remove_tree(temp_dir_);  // left over from an interrupted save
  fs::create_directory(temp_dir_, ec);
  FSDP_CHECK(!ec, "cannot create checkpoint directory '" + temp_dir_ + "': " + ec.message(),
             "check free space and permissions of --output-dir");
  fs::permissions(temp_dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec,
                  fs::perm_options::replace, ec);
}

std::string CheckpointWriter::commit(int64_t keep_last) {
  const std::string marker = join_path(temp_dir_, kCompleteMarker);
  write_file_durably(marker, std::string("complete\n"));
  fsync_path(temp_dir_, true);
  std::error_code ec;
  if (fs::exists(final_dir_, ec)) {
    // Same step saved again (e.g. a SIGTERM save right after a periodic one): replace it, and
    // put the earlier one back if the new one cannot take its place.
    const std::string old = final_dir_ + ".old";
    remove_tree(old);
    fs::rename(final_dir_, old, ec);
    FSDP_CHECK(!ec, "cannot move '" + final_dir_ + "' aside: " + ec.message(),
               "check the permissions of --output-dir");
    fs::rename(temp_dir_, final_dir_, ec);
    if (ec) {
      const std::string why = ec.message();
      fs::rename(old, final_dir_, ec);
      FSDP_FAIL("cannot rename '" + temp_dir_ + "' to '" + final_dir_ + "': " + why,
                "check that --output-dir is on one filesystem");
    }
    remove_tree(old);
  } else {
    fs::rename(temp_dir_, final_dir_, ec);
    FSDP_CHECK(!ec, "cannot rename '" + temp_dir_ + "' to '" + final_dir_ + "': " + ec.message(),
               "check that --output-dir is on one filesystem");
  }
  fsync_path(output_dir_, true);
  if (keep_last > 0) prune(output_dir_, keep_last, final_dir_);
  return final_dir_;
}

std::vector<std::string> recover_interrupted_saves(const std::string& output_dir) {
  std::vector<std::string> done;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return done;
  std::vector<fs::path> old, tmp;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    std::error_code dir_ec;
    if (!entry.is_directory(dir_ec)) continue;
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp_", 0) == 0 && parse_checkpoint_name(name.substr(5)))
      tmp.push_back(entry.path());
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".old") == 0 &&
        parse_checkpoint_name(name.substr(0, name.size() - 4))) {
      old.push_back(entry.path());
    }
  }
  for (const auto& o : old) {
    const std::string o_str = o.string();
    const std::string target = o_str.substr(0, o_str.size() - 4);
    if (!fs::exists(target, ec) && is_complete(o_str)) {
      fs::rename(o, target, ec);
      if (!ec) done.push_back("put back " + target + " (a replacement of it was interrupted)");
    } else if (remove_tree(o_str)) {
      done.push_back("removed " + o_str + " (left by an interrupted replacement)");
    }
  }
  for (const auto& t : tmp) {
    if (remove_tree(t.string())) done.push_back("removed " + t.string() + " (an interrupted save)");
  }
  if (!done.empty()) fsync_path(output_dir, true);
  return done;
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string OutputDirLock::acquire() {
  const std::string path = join_path(dir_, ".fsdp-train.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  FSDP_USAGE_CHECK(fd >= 0, fsdp::str("cannot open ", path, ": ", std::strerror(errno)),
                   "check --output-dir and its permissions");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {  // no flock on this file system: run without the check
      ::close(fd);
      return "";
    }
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd);
    return holder.empty() ? std::string("another process") : holder;
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const std::string me = fsdp::str("pid ", ::getpid(), " on host ", host, ", since ", when, "\n");
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, me.data(), me.size(), 0);
  fd_ = fd;
  return "";
}

std::vector<std::string> set_aside_newer(const std::string& output_dir, int64_t step) {
  std::vector<std::string> moved;
  for (const auto& c : list_complete(output_dir)) {
    if (c.step <= step) continue;
    std::string target = c.path + ".superseded";
    for (int i = 2; fs::exists(target); ++i) target = c.path + ".superseded-" + std::to_string(i);
    FSDP_CHECK(std::rename(c.path.c_str(), target.c_str()) == 0,
               fsdp::str("cannot rename ", c.path, " to ", target, ": ", std::strerror(errno)),
               "check the permissions of --output-dir");
    moved.push_back(target);
  }
  if (!moved.empty()) fsync_file(output_dir);
  return moved;
}

std::vector<std::string> prune(const std::string& output_dir, int64_t keep_last,
                               const std::string& keep) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  // Only real directories are pruned: a symbolic link named like a checkpoint (someone's pointer
  // to a checkpoint elsewhere) is neither counted nor removed, and nothing is ever deleted
  // through it (the removal below would otherwise reach into the link's target).
  std::vector<CheckpointRef> all;
  for (auto& c : list_complete(output_dir)) {
    std::error_code ec;
    if (fs::symlink_status(c.path, ec).type() == fs::file_type::directory) {
      all.push_back(std::move(c));
    } else {
      FSDP_LOG(kWarn) << "--keep-last: " << c.path
                      << " is a symbolic link, not a checkpoint directory: not pruned (remove "
                         "it yourself when it is not needed)";
    }
  }
  const std::string best = link_target(output_dir, kBestLink);
  const int64_t excess = static_cast<int64_t>(all.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) {
    if (fs::path(all[i].path) == fs::path(keep)) continue;
    if (!best.empty() && fs::path(all[i].path).filename() == best) continue;
    std::error_code ec;
    // Remove the marker first: a crash mid-removal leaves an incomplete, ignored directory.
    fs::remove(fs::path(all[i].path) / kCompleteMarker, ec);
    remove_tree(all[i].path);
    removed.push_back(all[i].path);
  }
  return removed;
}

void point_link(const std::string& output_dir, const std::string& link_name,
                const std::string& checkpoint_dir) {
  const std::string name = fs::path(checkpoint_dir).filename().string();
  const std::string link = join_path(output_dir, link_name);
  const std::string temp = join_path(output_dir, "." + link_name + ".tmp");
  std::error_code ec;
  fs::remove(temp, ec);  // left by an interrupted replacement (a link: remove() never follows it)
  fs::create_directory_symlink(name, temp, ec);
  FSDP_CHECK(!ec, "cannot create the symbolic link " + temp + ": " + ec.message(),
             "check that the file system of --output-dir supports symbolic links");
  fs::rename(temp, link, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(temp, ec);
    FSDP_FAIL("cannot replace " + link + " with a link to " + name + ": " + why,
              "remove " + link + " if it is not a link made by fsdp-train");
  }
  fsync_path(output_dir, true);
}

std::string link_target(const std::string& output_dir, const std::string& link_name) {
  std::error_code ec;
  const fs::path link = fs::path(output_dir) / link_name;
  if (!fs::is_symlink(fs::symlink_status(link, ec))) return "";
  const fs::path target = fs::read_symlink(link, ec);
  return ec ? std::string() : target.filename().string();
}

}  // namespace fsdp::checkpoint
