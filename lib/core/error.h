// Two levels of failure: FSDP_CHECK throws fsdp::Error with file:line, the
// failing library's own message and a hint for the user; FSDP_ASSERT aborts on broken
// invariants (use it in destructors and where unwinding is unsafe). Never swallow errors here.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fsdp {

// A user-facing failure: what went wrong, where it was detected, and what to do about it.
class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string hint, const char* file, int line);
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const std::string& location() const { return location_; }

 private:
  std::string message_;
  std::string hint_;
  std::string location_;
};

// Bad flags, bad configuration, bad input files: the program exits with code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// The checkpoint that ends a run (the final one, or on a stop signal) could not be written:
// exit code 3. Running again would only redo the work and fail the same way until there is room
// (so the launcher's --max-restarts does not restart it).
class CheckpointWriteError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message,
                              const std::string& hint);
[[noreturn]] void throw_usage_error(const char* file, int line, const std::string& message,
                                    const std::string& hint);
[[noreturn]] void assert_fail(const char* file, int line, const char* cond,
                              const std::string& message);

// The message of any exception as one line to quote in a log line or in another error: an
// fsdp::Error's message and location without its HINT line (the quoting error or log brings its
// own advice, and a user reading two HINT lines cannot tell which one to follow), LibTorch's
// without its C++ backtrace.
std::string error_text(const std::exception& e);
// True for an allocation failure on the host or a device: LibTorch's OutOfMemoryError, its CPU
// allocator's failure, std::bad_alloc.
bool is_out_of_memory(const std::exception& e);

// Formats any streamable arguments into one string: fsdp::str("rank ", r, " of ", n).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace fsdp

// FSDP_CHECK(cond, message, hint): message and hint are only evaluated on failure.
#define FSDP_CHECK(cond, message, hint)                                      \
  do {                                                                       \
    if (!(cond)) ::fsdp::throw_error(__FILE__, __LINE__, (message), (hint)); \
  } while (0)

// FSDP_USAGE_CHECK: like FSDP_CHECK for mistakes the user can fix in flags, config or inputs.
#define FSDP_USAGE_CHECK(cond, message, hint)                                      \
  do {                                                                             \
    if (!(cond)) ::fsdp::throw_usage_error(__FILE__, __LINE__, (message), (hint)); \
  } while (0)

// FSDP_FAIL / FSDP_USAGE_FAIL: an unconditional failure of the same two kinds (an unreachable
// case, a parse that failed in a catch block); the compiler knows neither returns.
#define FSDP_FAIL(message, hint) ::fsdp::throw_error(__FILE__, __LINE__, (message), (hint))
#define FSDP_USAGE_FAIL(message, hint) \
  ::fsdp::throw_usage_error(__FILE__, __LINE__, (message), (hint))

#define FSDP_ASSERT(cond, message)                                          \
  do {                                                                      \
    if (!(cond)) ::fsdp::assert_fail(__FILE__, __LINE__, #cond, (message)); \
  } while (0)
