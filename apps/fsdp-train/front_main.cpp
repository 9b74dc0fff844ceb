// fsdp-train, the front executable: std/POSIX only, never LibTorch, so that it starts in
// milliseconds. It blocks the stop signals first, then runs the launcher (--nproc-per-node) or
// execs fsdp-train-core, the real program next to it, with the signals still blocked.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "error_block.h"
#include "launcher.h"
#include "train/signals.h"

namespace {

// fsdp-train-core in the directory of this executable (not found through PATH: the two are
// built, copied and installed together).
std::string core_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self = n > 0 ? std::string(buf, n) : std::string();
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) +
         "/fsdp-train-core";
}

// The stop signals are blocked before the C++ runtime starts: .preinit_array runs right after
// the C library set itself up, before any static initialiser. From then on a SIGTERM, SIGINT,
// SIGHUP or SIGUSR1 waits for a handler (the launcher's, or the core's) instead of killing a
// process that has not set one up. The executable is linked statically (no dynamic loader
// runs first; not in sanitizer builds), so the window before this is microseconds.
extern "C" void fsdp_front_block_stop_signals(int, char**, char**) {
  fsdp::train::block_stop_signals();
}
__attribute__((section(".preinit_array"),
               used)) void (*const kBlockEarly)(int, char**,
                                                char**) = fsdp_front_block_stop_signals;

}  // namespace

int main(int argc, char** argv) {
  fsdp::train::block_stop_signals();  // again, for a toolchain that ignores .preinit_array
  // Files and directories the run writes are at most rw-r----- / rwxr-x---, whatever the
  // caller's umask (docs/security.md); the mask passes to the ranks and to the core.
  ::umask(::umask(0) | 027);
  if (int rc = fsdp::app::maybe_relaunch(argc, argv); rc >= 0) return rc;
  // Same PID, same arguments (mpirun and schedulers keep tracking this process).
  const std::string core = core_path();
  ::execv(core.c_str(), argv);
  fsdp::app::write_error_block(
      "cannot run '" + core + "': " + std::strerror(errno),
      "fsdp-train-core must sit next to fsdp-train: build the fsdp-train target (it builds "
      "both) and copy both executables together");
  return 1;
}
