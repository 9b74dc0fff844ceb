// Implementation of the rank-aware logger (core/log.h).
#include "core/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include "core/env.h"
#include "core/error.h"

namespace fsdp::log {

namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::atomic<int> g_rank{-1};
std::atomic<int> g_size{0};

const char* level_tag(Level l) {
  switch (l) {
    case Level::kTrace:
      return "TRACE";
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarn:
      return "WARN";
    case Level::kError:
      return "ERROR";
    default:
      return "";
  }
}
}  // namespace

Level parse_level(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "trace") return Level::kTrace;
  if (n == "debug") return Level::kDebug;
  if (n == "info") return Level::kInfo;
  if (n == "warn" || n == "warning") return Level::kWarn;
  if (n == "error") return Level::kError;
  if (n == "off" || n == "none") return Level::kOff;
  FSDP_USAGE_CHECK(
      false, "unknown log level '" + name + "'",
      "use one of trace, debug, info, warn, error, off (--log-level or FSDP_LOG_LEVEL)");
}

void set_level(Level level) {
  g_level = static_cast<int>(level);
}
Level level() {
  return static_cast<Level>(g_level.load());
}
void set_rank(int rank, int size) {
  g_rank = rank;
  g_size = size;
}
int rank() {
  return g_rank.load();
}
bool enabled(Level l) {
  return static_cast<int>(l) >= g_level.load() && l != Level::kOff;
}

void init_from_env() {
  const std::optional<std::string> value = env::text("FSDP_LOG_LEVEL");
  if (!value) return;
  try {
    set_level(parse_level(*value));
  } catch (const UsageError& e) {
    throw UsageError("FSDP_LOG_LEVEL: " + e.message(), e.hint(), __FILE__, __LINE__);
  }
}

Line::Line(Level level, bool rank0_only) : level_(level), active_(enabled(level)) {
  if (!active_) return;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
  os_ << ts << ' ';
  if (g_rank >= 0 && !rank0_only) {
    os_ << "[rank " << g_rank << '/' << g_size << "] ";
  }
  if (level_ != Level::kInfo) os_ << level_tag(level_) << ": ";
}

Line::~Line() {
  if (!active_) return;
  os_ << '\n';
  const std::string s = os_.str();
  // One write per line keeps lines whole when several ranks share stderr.
  ssize_t rc = ::write(STDERR_FILENO, s.data(), s.size());
  (void)rc;
}

}  // namespace fsdp::log
