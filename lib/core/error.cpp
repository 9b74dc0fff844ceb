// Formatting of fsdp::Error messages and the abort path of FSDP_ASSERT.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

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
