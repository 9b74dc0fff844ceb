// Full-disk tests: run code while the kernel refuses file writes past a size (EFBIG, with
// SIGXFSZ ignored), as a full disk refuses them with ENOSPC. Only for code that starts no MPI
// (Open MPI's own files hit the limit too).
#pragma once

#include <sys/resource.h>
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdint>

namespace fsdp::testing {

template <class Fn>
void with_file_size_limit(int64_t limit_bytes, Fn&& fn) {
  struct rlimit old {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = static_cast<rlim_t>(limit_bytes);
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  fn();
  REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, handler);
}

}  // namespace fsdp::testing
