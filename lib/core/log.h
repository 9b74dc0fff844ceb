// Rank-aware logging: every line carries "[rank r/n]", rank-0 helpers for once-per-job lines,
// levels from --log-level or FSDP_LOG_LEVEL. Lines are written with one write() so lines from
// ranks sharing a terminal do not interleave mid-line. Never log secrets (W&B keys) here.
#pragma once

#include <sstream>
#include <string>

namespace fsdp::log {

enum class Level { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

// Parses "trace|debug|info|warn|error|off" (case-insensitive); throws UsageError otherwise.
Level parse_level(const std::string& name);
void set_level(Level level);
Level level();
// Called once the communicator knows the rank; before that the prefix is "[rank ?]".
void set_rank(int rank, int size);
int rank();
bool enabled(Level level);
// Reads FSDP_LOG_LEVEL when set (the flag, applied later, wins).
void init_from_env();

// One log line; the text is emitted by the destructor.
class Line {
 public:
  Line(Level level, bool rank0_only);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  std::ostream& stream() { return os_; }

 private:
  Level level_;
  bool active_;
  std::ostringstream os_;
};

}  // namespace fsdp::log

// FSDP_LOG(kInfo) << "..." on every rank; FSDP_LOG0(kInfo) << "..." on rank 0 only. The for-loop
// form runs the statement at most once and, unlike if/else, is safe inside an unbraced if.
#define FSDP_LOG(lvl)                                                                   \
  for (bool fsdp_log_on_ = ::fsdp::log::enabled(::fsdp::log::Level::lvl); fsdp_log_on_; \
       fsdp_log_on_ = false)                                                            \
  ::fsdp::log::Line(::fsdp::log::Level::lvl, false).stream()
#define FSDP_LOG0(lvl)                                                                \
  for (bool fsdp_log_on_ =                                                            \
           ::fsdp::log::enabled(::fsdp::log::Level::lvl) && ::fsdp::log::rank() <= 0; \
       fsdp_log_on_; fsdp_log_on_ = false)                                            \
  ::fsdp::log::Line(::fsdp::log::Level::lvl, true).stream()
