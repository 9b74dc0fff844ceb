// The streaming spool (spool.h): the ledger, rank 0's scanner, the budget file, acknowledgements
// and the loader's view of the stream.
#include "data/spool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/fs_util.h"
#include "core/log.h"

namespace fsdp::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLedgerHeader = "fsdp-train spool ledger v1";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Names a producer may use while it writes (never taken as samples, never warned about).
bool is_temporary_name(const std::string& name) {
  return name.empty() || name[0] == '.' || ends_with(name, ".tmp") || ends_with(name, ".lock") ||
         ends_with(name, ".part") || ends_with(name, ".partial");
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

std::string gib_text(uint64_t bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / 1073741824.0 << " GiB";
  return os.str();
}

}  // namespace

bool is_spool_sample_name(const std::string& name) {
  return !name.empty() && name[0] != '.' &&
         (ends_with(name, ".ckpt") || ends_with(name, ".ckpt.gz"));
}

// ---- ledger ----

SpoolLedger::SpoolLedger(std::string path) : path_(std::move(path)) {
  refresh();
}

void SpoolLedger::parse_line(const std::string& line) {
  if (line.empty()) return;
  if (line.rfind(kLedgerHeader, 0) == 0) {
    owner_ = line.size() > std::strlen(kLedgerHeader) + 1
                 ? line.substr(std::strlen(kLedgerHeader) + 1)
                 : std::string();
    return;
  }
  std::istringstream in(line);
  char kind = 0;
  in >> kind;
  if (kind == 'A') {
    // "A <name> <bytes>": the name (relative to the spool) may hold spaces.
    LedgerEntry e;
    const size_t last = line.rfind(' ');
    bool ok = line.size() > 2 && line[1] == ' ' && last > 2;
    if (ok) {
      e.name = line.substr(2, last - 2);
      try {
        e.bytes = std::stoull(line.substr(last + 1));
      } catch (const std::exception&) {
        ok = false;
      }
    }
    FSDP_USAGE_CHECK(ok && !e.name.empty(), path_ + ": unreadable line '" + line + "'",
                     "the ledger was edited or damaged: restore it, or remove the spool's "
                     ".spool directory and start the run over");
    arrivals_.push_back(std::move(e));
  } else if (kind == 'E') {
    int64_t n = 0;
    in >> n;
    ended_ = true;
  } else if (kind == 'K') {
    int64_t n = 0;
    in >> n;
    acknowledged_ = std::max(acknowledged_, n);
  } else {
    FSDP_USAGE_FAIL(path_ + ": unreadable line '" + line + "'",
                    "the ledger was edited or damaged: restore it, or remove the spool's .spool "
                    "directory and start the run over");
  }
}

bool SpoolLedger::refresh() {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return false;
  in.seekg(static_cast<std::streamoff>(offset_));
  std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (chunk.empty()) return false;
  offset_ += chunk.size();
  partial_ += chunk;
  bool changed = false;
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    parse_line(partial_.substr(start, nl - start));
    changed = true;
  }
  partial_.erase(0, start);
  return changed;
}

void SpoolLedger::append(const std::string& text) {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  FSDP_USAGE_CHECK(fd >= 0, fsdp::str("cannot open ", path_, ": ", std::strerror(errno)),
                   "check the spool directory's permissions and free space");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      FSDP_USAGE_FAIL(fsdp::str("cannot write ", path_, ": ", std::strerror(err)),
                      "free space on the spool's file system");
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  FSDP_USAGE_CHECK(synced, fsdp::str("cannot fsync ", path_, ": ", std::strerror(errno)),
                   "check the spool's file system");
}

void SpoolLedger::start(const std::string& owner) {
  // A torn last line (the trainer died inside a write) is dropped: its arrival is seen again.
  std::error_code ec;
  if (fs::exists(path_, ec)) {
    std::ifstream in(path_, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t keep = all.rfind('\n') == std::string::npos ? 0 : all.rfind('\n') + 1;
    if (keep < all.size()) {
      FSDP_USAGE_CHECK(::truncate(path_.c_str(), static_cast<off_t>(keep)) == 0,
                       fsdp::str("cannot repair ", path_, ": ", std::strerror(errno)),
                       "check the spool directory's permissions");
    }
    *this = SpoolLedger(path_);
    if (!owner_.empty() || !arrivals_.empty()) return;
  }
  append(fsdp::str(kLedgerHeader, " ", owner, "\n"));
  refresh();
}

void SpoolLedger::append_arrivals(const std::vector<LedgerEntry>& entries) {
  if (entries.empty()) return;
  std::string text;
  for (const auto& e : entries) text += fsdp::str("A ", e.name, " ", e.bytes, "\n");
  append(text);
}

void SpoolLedger::append_end(int64_t arrivals) {
  append(fsdp::str("E ", arrivals, "\n"));
}

void SpoolLedger::append_acknowledged(int64_t arrivals) {
  append(fsdp::str("K ", arrivals, "\n"));
}

// ---- the spool ----

Spool::Spool(SpoolOptions options)
    : options_(std::move(options)),
      order_(options_.order),
      control_dir_((fs::path(options_.dir) / kSpoolControlDir).string()),
      ledger_((fs::path(options_.dir) / kSpoolControlDir / "ledger").string()) {
  std::error_code ec;
  FSDP_USAGE_CHECK(fs::is_directory(options_.dir, ec),
                   "--stream: " + options_.dir + " is not a directory",
                   "create the spool directory the producers write into (docs/data.md "
                   "\"Streaming\") and pass it as --train-hidden-states-path");
  if (!options_.scans) return;
  refuse_offline_dump();
  make_dirs(control_dir_, "check the spool directory's permissions");
  const std::string lock_path = control_dir_ + "/trainer.lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  FSDP_USAGE_CHECK(lock_fd_ >= 0, fsdp::str("cannot open ", lock_path, ": ", std::strerror(errno)),
                   "check the spool directory's permissions");
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    FSDP_USAGE_FAIL("--stream: another trainer is reading the spool " + options_.dir,
                    "one trainer per spool: give this run a spool directory of its own");
  }
  ledger_.start(options_.owner);
  FSDP_USAGE_CHECK(
      ledger_.owner() == options_.owner,
      fsdp::str("--stream: the spool ", options_.dir, " was started by the run in ",
                ledger_.owner(), ", not this one (--output-dir ", options_.owner, ")"),
      "resume that run with its own --output-dir, or give this run an empty spool directory "
      "(removing the spool's .spool directory starts its order over)");
  for (const auto& e : ledger_.arrivals()) known_.insert(e.name);
  scan_once();
  scanner_ = std::thread([this] { scan_loop(); });
}

void Spool::refuse_offline_dump() const {
  // A stream deletes what it trains: a directory of samples that was never declared a spool is
  // likely an offline dump given --stream by mistake.
  std::error_code ec;
  if (fs::exists(control_dir_, ec)) return;
  int64_t samples = 0;
  for (auto it = fs::recursive_directory_iterator(options_.dir, ec);
       it != fs::recursive_directory_iterator() && samples == 0; it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec) && is_spool_sample_name(it->path().filename().string())) ++samples;
  }
  FSDP_USAGE_CHECK(samples == 0,
                   "--stream: " + options_.dir +
                       " already holds samples but is not a spool (no .spool directory): a stream "
                       "deletes every sample once a checkpoint covers it",
                   "to train an existing dump, drop --stream (or replay it into an empty spool: "
                   "apps/spool/fsdp_spool.py replay); to declare the directory a spool whose "
                   "samples may be deleted, create " +
                       control_dir_ + " first");
}

Spool::~Spool() {
  stop_scanner_ = true;
  shutdown();
  if (scanner_.joinable()) scanner_.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void Spool::scan_loop() {
  double quiet_until = 0;  // a failing scan is reported once a minute, not every poll
  while (!stop_scanner_) {
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_seconds));
    try {
      scan_once();
    } catch (const std::exception& e) {
      if (now_seconds() >= quiet_until) {
        quiet_until = now_seconds() + 60;
        FSDP_LOG(kWarn) << "--stream: scanning " << options_.dir << ": " << error_text(e)
                        << " (trying again)";
      }
    }
  }
}

void Spool::scan_once() {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.refresh();
  const bool ended = ledger_.ended();  // after the end only the usage is measured
  // The marker is looked at before the listing: every file renamed in before it was written is
  // in this listing, so an end recorded after it loses nothing.
  std::error_code ec;
  const bool end_marked = fs::exists(fs::path(options_.dir) / kEndOfStreamFile, ec);
  struct Found {
    std::string name;
    uint64_t bytes;
    int64_t mtime;
  };
  std::vector<Found> ready;
  bool waiting = false;
  uint64_t used = 0;
  const double now = now_seconds();
  std::set<std::string> names;
  // The whole tree (SpecForge's prepare_hidden_states writes rows_<a>-<b>/data_<i>.ckpt), less
  // the control directory and hidden directories; names are relative to DIR.
  for (auto it = fs::recursive_directory_iterator(options_.dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::directory_entry& entry = *it;
    const std::string leaf = entry.path().filename().string();
    if (entry.is_directory(ec)) {
      if (!leaf.empty() && leaf[0] == '.') it.disable_recursion_pending();
      continue;
    }
    const std::string name = entry.path().lexically_relative(options_.dir).string();
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    used += static_cast<uint64_t>(st.st_size);
    names.insert(name);
    if (ended || name == kEndOfStreamFile || known_.count(name)) continue;
    if (!is_spool_sample_name(leaf)) {
      if (!is_temporary_name(leaf) && warned_.insert(name).second) {
        FSDP_LOG(kWarn) << "--stream: " << entry.path().string()
                        << " is not a sample file (*.ckpt or *.ckpt.gz): ignored";
      }
      continue;
    }
    if (fs::exists(entry.path().string() + ".lock", ec)) {
      waiting = true;
      continue;
    }
    if (options_.settle_seconds > 0) {
      Pending& p = pending_[name];
      if (p.since == 0 || p.bytes != static_cast<uint64_t>(st.st_size) ||
          p.mtime_ns != mtime_ns(st)) {
        p = {static_cast<uint64_t>(st.st_size), mtime_ns(st), now};
      }
      if (now - p.since < options_.settle_seconds) {
        waiting = true;
        continue;
      }
      pending_.erase(name);
    }
    ready.push_back({name, static_cast<uint64_t>(st.st_size), mtime_ns(st)});
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = names.count(it->first) ? std::next(it) : pending_.erase(it);
  }
  std::sort(ready.begin(), ready.end(), [](const Found& a, const Found& b) {
    return a.mtime != b.mtime ? a.mtime < b.mtime : a.name < b.name;
  });
  std::vector<LedgerEntry> entries;
  for (const auto& f : ready) {
    entries.push_back({f.name, f.bytes});
    known_.insert(f.name);
  }
  ledger_.append_arrivals(entries);
  if (end_marked && !waiting && !ended) {
    ledger_.refresh();
    ledger_.append_end(static_cast<int64_t>(ledger_.arrivals().size()));
    FSDP_LOG(kInfo) << "--stream: " << kEndOfStreamFile << " in " << options_.dir << " after "
                    << ledger_.arrivals().size() << " samples: training drains the spool";
  }
  ledger_.refresh();
  used_bytes_ = used;
  peak_bytes_ = std::max(peak_bytes_, used);
  write_room(used);
}

void Spool::write_room(uint64_t used) {
  const uint64_t budget = options_.budget_bytes;
  nlohmann::json j;
  j["budget_bytes"] = budget;
  j["used_bytes"] = used;
  j["room_bytes"] = budget == 0 ? nullptr : nlohmann::json(budget > used ? budget - used : 0);
  j["arrived"] = ledger_.arrivals().size();
  j["acknowledged"] = ledger_.acknowledged();
  j["ended"] = ledger_.ended();
  j["updated_unix"] = static_cast<int64_t>(std::time(nullptr));
  const std::string path = control_dir_ + "/room.json", tmp = control_dir_ + "/.room.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    if (!out) return;  // advisory: the next scan writes it again
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

bool Spool::refresh_locked() {
  return ledger_.refresh();
}

int64_t Spool::wait_for(int64_t position) {
  const double start = now_seconds();
  double next_note = start + 60;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    refresh_locked();
    const auto n = static_cast<int64_t>(ledger_.arrivals().size());
    const StreamOrder::Lookup l = order_.at(position, n, ledger_.ended());
    if (l.state == StreamOrder::State::kKnown) return l.arrival;
    if (l.state == StreamOrder::State::kEnded) throw StreamEnded();
    if (shutdown_ || (options_.interrupted && options_.interrupted())) {
      throw StreamInterrupted(
          fsdp::str("--stream: stopped while waiting for the sample of position ", position, " in ",
                    options_.dir),
          "run again with --resume auto: the samples consumed since the last checkpoint are "
          "trained again",
          __FILE__, __LINE__);
    }
    if (now_seconds() >= next_note) {
      next_note += 60;
      FSDP_LOG(kWarn) << "--stream: waiting " << static_cast<int64_t>(now_seconds() - start)
                      << " s for sample " << l.arrivals_needed << " of " << options_.dir << " ("
                      << n << " arrived, " << ledger_.acknowledged() << " acknowledged"
                      << (options_.budget_bytes > 0
                              ? fsdp::str(", spool ", gib_text(used_bytes_), " of the ",
                                          gib_text(options_.budget_bytes), " budget")
                              : std::string())
                      << "); producers write there, and " << kEndOfStreamFile << " ends the stream";
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_seconds));
    lock.lock();
  }
}

std::string Spool::path_of(int64_t arrival) const {
  std::lock_guard<std::mutex> lock(mu_);
  return (fs::path(options_.dir) / ledger_.arrivals().at(static_cast<size_t>(arrival)).name)
      .string();
}

std::shared_ptr<FeatureDataset> Spool::first_arrivals(int64_t n) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      refresh_locked();
      const int64_t from = ledger_.acknowledged();
      const auto have = static_cast<int64_t>(ledger_.arrivals().size()) - from;
      if (have >= n || ledger_.ended()) {
        std::vector<std::string> files;
        for (int64_t k = from; k < from + std::min(n, have); ++k)
          files.push_back((fs::path(options_.dir) / ledger_.arrivals()[k].name).string());
        FSDP_USAGE_CHECK(!files.empty(),
                         "--stream: " + options_.dir + " ended (" + kEndOfStreamFile +
                             ") without any sample left to train",
                         "remove " + std::string(kEndOfStreamFile) +
                             " and let the producers write samples first");
        return open_ckpt_dataset(options_.dir, std::move(files), options_.dataset);
      }
      if (shutdown_ || (options_.interrupted && options_.interrupted())) {
        throw StreamInterrupted(
            "--stream: stopped while waiting for the first samples in " + options_.dir,
            "start the run again once producers write samples", __FILE__, __LINE__);
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_seconds));
  }
}

void Spool::shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
}

int64_t Spool::acknowledge(int64_t consumed) {
  std::lock_guard<std::mutex> lock(mu_);
  refresh_locked();
  const auto n = static_cast<int64_t>(ledger_.arrivals().size());
  const int64_t upto = order_.acknowledged(consumed, n, ledger_.ended());
  if (upto <= ledger_.acknowledged()) return ledger_.acknowledged();
  for (int64_t k = ledger_.acknowledged(); k < upto; ++k) {
    std::error_code ec;
    fs::remove(fs::path(options_.dir) / ledger_.arrivals()[k].name, ec);
    if (ec) {
      FSDP_LOG(kWarn) << "--stream: cannot delete the acknowledged sample "
                      << ledger_.arrivals()[k].name << ": " << ec.message();
    }
  }
  ledger_.append_acknowledged(upto);
  refresh_locked();
  return upto;
}

bool Spool::wants_checkpoint(int64_t consumed) {
  if (options_.budget_bytes == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  refresh_locked();
  const auto n = static_cast<int64_t>(ledger_.arrivals().size());
  const int64_t upto = order_.acknowledged(consumed, n, ledger_.ended());
  uint64_t held = 0;
  for (int64_t k = ledger_.acknowledged(); k < upto; ++k) held += ledger_.arrivals()[k].bytes;
  return held * 2 >= options_.budget_bytes;
}

void Spool::check_resumable(int64_t consumed, const std::string& checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  refresh_locked();
  const auto n = static_cast<int64_t>(ledger_.arrivals().size());
  const int64_t upto = order_.acknowledged(consumed, n, ledger_.ended());
  FSDP_USAGE_CHECK(
      ledger_.acknowledged() <= upto,
      fsdp::str("--stream: ", checkpoint, " consumed the stream up to arrival ", upto, ", but ",
                ledger_.acknowledged(),
                " arrivals were acknowledged (deleted) after a newer checkpoint"),
      "resume from the newest checkpoint (the one that acknowledged them); an older one would "
      "need samples that are gone");
}

Spool::Stats Spool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  refresh_locked();
  Stats s;
  s.arrivals = static_cast<int64_t>(ledger_.arrivals().size());
  s.acknowledged = ledger_.acknowledged();
  s.ended = ledger_.ended();
  s.used_bytes = used_bytes_;
  s.peak_bytes = peak_bytes_;
  return s;
}

// ---- the loader's view ----

SpoolDataset::SpoolDataset(std::shared_ptr<Spool> spool, int64_t capacity)
    : spool_(std::move(spool)), capacity_(capacity) {}

RawSample SpoolDataset::read(int64_t i) const {
  const int64_t arrival = spool_->wait_for(i);
  uint64_t bytes = 0;
  RawSample s = read_ckpt_sample(spool_->path_of(arrival), spool_->options().dataset, &bytes);
  ++files_opened_;
  bytes_read_ += bytes;
  return s;
}

TokenSample SpoolDataset::read_tokens(int64_t i) const {
  RawSample s = read(i);
  return {s.input_ids, s.loss_mask};
}

std::string SpoolDataset::source(int64_t i) const {
  const int64_t arrival = spool_->wait_for(i);
  return spool_->path_of(arrival);
}

const std::string& SpoolDataset::root() const {
  return spool_->options().dir;
}

void SpoolDataset::cancel_waits() const {
  spool_->shutdown();
}

}  // namespace fsdp::data
