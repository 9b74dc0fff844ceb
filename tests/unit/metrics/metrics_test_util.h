// Helpers for the lib/metrics unit tests: scratch directories, reading files, running the venv's
// Python. Test-only.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include "support/test_paths.h"

namespace fsdp::metrics::test {

inline std::string scratch_dir(const std::string& name) {
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test-scratch/metrics/" + name;
  REQUIRE(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()) == 0);
  return dir;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a command, returns its exit code and stdout.
inline int run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace fsdp::metrics::test
