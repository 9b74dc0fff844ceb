// Generated parts of the docs (flag limits, environment variables): a page holds the generator's
// output between two marker lines, and a test keeps the two in sync. FSDP_UPDATE_DOCS=1 rewrites
// the part instead of failing (tests only: the variable is not part of fsdp-train).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace fsdp::test {

// Checks that the text between `begin` (a whole line, newline included) and `end` in the file at
// `path` equals `want`; `regenerate` is the command that rewrites it, shown on failure.
inline void check_generated_section(const std::string& path, const std::string& begin,
                                    const std::string& end, const std::string& want,
                                    const std::string& regenerate) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  const size_t b = doc.find(begin), e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  REQUIRE(b < e);
  const std::string current = doc.substr(b + begin.size(), e - b - begin.size());
  const char* update = std::getenv("FSDP_UPDATE_DOCS");
  if (update && std::string(update) == "1" && current != want) {
    doc = doc.substr(0, b + begin.size()) + want + doc.substr(e);
    std::ofstream(path) << doc;
  }
  INFO("regenerate: FSDP_UPDATE_DOCS=1 " << regenerate);
  CHECK(current == want);
}

}  // namespace fsdp::test
