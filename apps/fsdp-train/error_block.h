// The user-facing error block: "fsdp-train: error: MESSAGE" and "---> HINT: HINT" written to
// stderr in one write(2), so that under mpirun no other output (another rank, Open MPI's abort
// banner) can land between the two lines. Header-only, std/POSIX only (the front uses it too).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <string>

namespace fsdp::app {

// Flushes stdout first (what was printed before the error stays before it), then writes the
// block in one call (a block is far below PIPE_BUF, so a pipe takes it whole; a short write,
// on a full disk, is continued). An empty hint leaves the HINT line out.
inline void write_error_block(const std::string& message, const std::string& hint) {
  std::cout.flush();
  std::fflush(stdout);
  std::cerr.flush();
  std::string block = "fsdp-train: error: " + message + "\n";
  if (!hint.empty()) block += "---> HINT: " + hint + "\n";
  size_t done = 0;
  while (done < block.size()) {
    const ssize_t n = ::write(STDERR_FILENO, block.data() + done, block.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace fsdp::app
