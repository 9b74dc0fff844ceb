// Formatting of fsdp::Error messages and the abort path of FSDP_ASSERT.
#include "core/error.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace fsdp {

namespace {
std::string base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

std::string compose(const std::string& message, const std::string& hint, const std::string& loc) {
  std::string s = message + " (" + loc + ")";
  if (!hint.empty()) s += "\n---> HINT: " + hint;
  return s;
}
}  // namespace

Error::Error(std::string what, std::string hint, const char* file, int line)
    : std::runtime_error(compose(what, hint, base_name(file) + ":" + std::to_string(line))),
      message_(std::move(what)),
      hint_(std::move(hint)),
      location_(base_name(file) + ":" + std::to_string(line)) {}

std::string error_text(const std::exception& e) {
  if (const auto* f = dynamic_cast<const Error*>(&e))
    return f->message() + " (" + f->location() + ")";
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) || dynamic_cast<const std::bad_alloc*>(&e))
    return true;
  // The CPU allocator reports a failed allocation as a plain c10::Error.
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  return c && c->msg().find("can't allocate memory") != std::string::npos;
}

void throw_error(const char* file, int line, const std::string& message, const std::string& hint) {
  throw Error(message, hint, file, line);
}

void throw_usage_error(const char* file, int line, const std::string& message,
                       const std::string& hint) {
  throw UsageError(message, hint, file, line);
}

void assert_fail(const char* file, int line, const char* cond, const std::string& message) {
  std::fprintf(stderr, "fsdp-train: internal invariant broken at %s:%d: %s: %s\n",
               base_name(file).c_str(), line, cond, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace fsdp
