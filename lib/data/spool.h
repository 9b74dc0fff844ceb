// The streaming data source (docs/data.md "Streaming"): producers publish SpecForge .ckpt /
// .ckpt.gz samples into a spool directory by atomic rename while the run trains; the trainer
// trains them in arrival order, deletes a sample only after the checkpoint that covers its last
// use is complete, and keeps a small file current that says how much of the disk budget is left.
//
// Files in the spool directory DIR:
//   <name>.ckpt / <name>.ckpt.gz  a sample, complete once it has this name (temporary names start
//                                 with '.' or end in .tmp; a <name>.lock beside it, vLLM's
//                                 convention, also marks it as still being written); in DIR or
//                                 a subdirectory of it (SpecForge's rows_<a>-<b>/), not hidden
//   END_OF_STREAM                 the producers are done: the run drains the spool and ends
//   .spool/ledger                 rank 0's record: arrivals in order, the end, acknowledgements
//   .spool/room.json              rank 0 keeps it current: budget, bytes used, room left
//   .spool/lock                   producers hold it (flock) while they reserve room
//   .spool/trainer.lock           held by the one trainer of this spool
// Rank 0 scans DIR and appends to the ledger; every rank reads the ledger (the directory is
// shared), so all ranks see one order. The ledger survives the trainer: a resumed run trains the
// recorded arrivals in the recorded order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/stream_order.h"

namespace fsdp::data {

// The stream has no sample at this position: it ended (the loader ends the epoch).
class StreamEnded : public std::exception {
 public:
  const char* what() const noexcept override { return "the stream ended"; }
};

inline constexpr const char* kEndOfStreamFile = "END_OF_STREAM";
inline constexpr const char* kSpoolControlDir = ".spool";

// Whether `name` (a file's name, its last path part) is a complete sample's name: *.ckpt or
// *.ckpt.gz, not hidden. (A .lock beside it is checked by the scanner.)
bool is_spool_sample_name(const std::string& name);

// The ledger file: "A <name> <bytes>" per arrival, "E <arrivals>" at the end of the stream,
// "K <arrivals>" when that many are acknowledged (deleted), after a header line. Readers take
// complete lines only; the writer drops a torn last line when it opens the file.
struct LedgerEntry {
  std::string name;
  uint64_t bytes = 0;
};

class SpoolLedger {
 public:
  // Reads what `path` holds (nothing when it does not exist).
  explicit SpoolLedger(std::string path);
  // Reads the lines appended since the last call. Returns true when anything changed.
  bool refresh();
  const std::vector<LedgerEntry>& arrivals() const { return arrivals_; }
  bool ended() const { return ended_; }
  int64_t acknowledged() const { return acknowledged_; }
  // The header's run (the output directory of the run that started the ledger), "" if none.
  const std::string& owner() const { return owner_; }
  const std::string& path() const { return path_; }

  // Writer side (rank 0): append lines and fsync. `start` writes the header when the file is
  // new (and drops a torn last line of an old one).
  void start(const std::string& owner);
  void append_arrivals(const std::vector<LedgerEntry>& entries);
  void append_end(int64_t arrivals);
  void append_acknowledged(int64_t arrivals);

 private:
  void append(const std::string& text);
  void parse_line(const std::string& line);
  std::string path_;
  uint64_t offset_ = 0;
  std::string partial_;
  std::vector<LedgerEntry> arrivals_;
  bool ended_ = false;
  int64_t acknowledged_ = 0;
  std::string owner_;
};

struct SpoolOptions {
  std::string dir;             // the spool directory (--train-hidden-states-path)
  std::string owner;           // the run's output directory (the ledger's header)
  uint64_t budget_bytes = 0;   // --stream-max-gb; 0: no budget
  double settle_seconds = 0;   // --stream-settle-s: in-place writers' files must rest so long
  double poll_seconds = 0.05;  // how often the scanner lists the directory
  StreamOrderOptions order;    // uses, window, round, seed
  DatasetOptions dataset;      // how samples are validated
  bool scans = false;          // rank 0: scans, writes the ledger and room.json, deletes
  // Asked while a read waits for a sample: true stops the wait (StreamInterrupted).
  std::function<bool()> interrupted;
};

// A wait for a sample ended because the run was told to stop (a signal) or shut down.
class StreamInterrupted : public UsageError {
 public:
  using UsageError::UsageError;
};

class Spool;

// The spool as the loader sees it: position i of the stream (the sampler's index, shuffle off)
// is read when it is known, waiting for it to arrive; a position past the end throws
// StreamEnded. size() is the positions the run may train (--total-steps' worth).
class SpoolDataset final : public FeatureDataset {
 public:
  SpoolDataset(std::shared_ptr<Spool> spool, int64_t capacity);
  std::string format() const override { return "spool"; }
  int64_t size() const override { return capacity_; }
  RawSample read(int64_t i) const override;
  TokenSample read_tokens(int64_t i) const override;
  std::string source(int64_t i) const override;
  const std::string& root() const override;
  void cancel_waits() const override;

 private:
  std::shared_ptr<Spool> spool_;
  int64_t capacity_;
};

class Spool : public std::enable_shared_from_this<Spool> {
 public:
  // Opens DIR (a usage error when it is not a directory, or another trainer holds it, or its
  // ledger belongs to another run) and, on the scanning rank, starts the scanner thread.
  explicit Spool(SpoolOptions options);
  ~Spool();  // stops the scanner
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  const SpoolOptions& options() const { return options_; }
  const StreamOrder& order() const { return order_; }

  // The arrival trained at `position`, waiting for it; StreamEnded past the end,
  // StreamInterrupted when options().interrupted() says so or shutdown() was called.
  int64_t wait_for(int64_t position);
  // The first `n` arrivals (fewer when the stream ends first) as a fixed dataset, waiting for
  // them: what the start-up checks and the vocabulary mapping read.
  std::shared_ptr<FeatureDataset> first_arrivals(int64_t n);
  std::string path_of(int64_t arrival) const;
  // Wakes and fails every waiting read (the loader is shutting down).
  void shutdown();

  // Rank 0, after the checkpoint of `consumed` positions is complete: deletes the arrivals it
  // acknowledges (StreamOrder::acknowledged: at the stream's end, once every trained position is
  // consumed, all of them) and records them. Returns how many arrivals are acknowledged now.
  int64_t acknowledge(int64_t consumed);
  // Rank 0: whether the samples consumed but not acknowledged hold half the budget or more (a
  // checkpoint now gives the producers room).
  bool wants_checkpoint(int64_t consumed);
  // The arrivals a checkpoint of `consumed` positions still needs (acknowledged ones are not),
  // checked on resume: a usage error when a newer checkpoint's acknowledgement deleted them.
  void check_resumable(int64_t consumed, const std::string& checkpoint);

  struct Stats {
    int64_t arrivals = 0, acknowledged = 0;
    bool ended = false;
    uint64_t used_bytes = 0, peak_bytes = 0;  // the spool directory (rank 0's scans)
  };
  Stats stats();

 private:
  void refuse_offline_dump() const;
  void scan_loop();
  void scan_once();
  void write_room(uint64_t used);
  bool refresh_locked();

  SpoolOptions options_;
  StreamOrder order_;
  std::string control_dir_;
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  SpoolLedger ledger_;
  bool shutdown_ = false;
  uint64_t used_bytes_ = 0, peak_bytes_ = 0;
  // Scanner (rank 0): names in the ledger, files waiting to settle, names warned about.
  std::set<std::string> known_;
  struct Pending {
    uint64_t bytes = 0;
    int64_t mtime_ns = 0;
    double since = 0;
  };
  std::map<std::string, Pending> pending_;
  std::set<std::string> warned_;
  std::thread scanner_;
  std::atomic<bool> stop_scanner_{false};
};

}  // namespace fsdp::data
