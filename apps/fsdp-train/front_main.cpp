// fsdp-train, the front executable: std/POSIX only, never LibTorch, so that it starts in
// milliseconds. It blocks the stop signals first, then runs the launcher (--nproc-per-node) or
// execs fsdp-train-core, the real program next to it, with the signals still blocked and the
// allocator FSDP_ALLOCATOR picks preloaded.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env.h"
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

// FSDP_ALLOCATOR (docs/troubleshooting.md "Host memory grows"): the core runs with jemalloc
// preloaded when it is installed (auto) or asked for. glibc's malloc serves the tensors of
// shapes that vary from step to step (packing, micro-batches of several samples) from a heap
// that fragments: a rank's resident memory keeps growing for many steps. Returns false, with
// `error` and `hint` set, for a bad value or when jemalloc was required and is not installed.
constexpr const char* kJemalloc = "libjemalloc.so.2";

std::string find_jemalloc() {
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                          "/usr/lib", "/usr/local/lib"}) {
    const std::string path = std::string(dir) + "/" + kJemalloc;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return path;
  }
  return {};
}

bool choose_allocator(std::string& error, std::string& hint) {
  const fsdp::env::Reading r = fsdp::env::read("FSDP_ALLOCATOR");
  if (!r.error.empty()) {
    error = r.error;
    hint = r.hint;
    return false;
  }
  const std::string want = r.text.value_or("auto");
#ifdef FSDP_SANITIZER_BUILD
  return true;  // the sanitizer runtime must be the first library: no preload
#endif
  if (want == "system") return true;
  const std::string lib = find_jemalloc();
  if (lib.empty()) {
    if (want == "jemalloc") {
      error = std::string("FSDP_ALLOCATOR=jemalloc but ") + kJemalloc + " is not installed";
      hint = "install Debian's libjemalloc2 (launch/setup.sh does), or set FSDP_ALLOCATOR=auto";
    }
    return want != "jemalloc";
  }
  const std::string before = fsdp::env::text("LD_PRELOAD").value_or("");
  if (before.find(kJemalloc) != std::string::npos) return true;  // already (a relaunch)
  const std::string value = before.empty() ? lib : lib + ":" + before;
  ::setenv("LD_PRELOAD", value.c_str(), 1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::train::block_stop_signals();  // again, for a toolchain that ignores .preinit_array
  // Files and directories the run writes are at most rw-r----- / rwxr-x---, whatever the
  // caller's umask (docs/security.md); the mask passes to the ranks and to the core.
  ::umask(::umask(0) | 027);
  if (int rc = fsdp::app::maybe_relaunch(argc, argv); rc >= 0) return rc;
  // Same PID, same arguments (mpirun and schedulers keep tracking this process).
  std::string allocator_error, allocator_hint;
  if (!choose_allocator(allocator_error, allocator_hint)) {
    fsdp::app::write_error_block(allocator_error, allocator_hint);
    return 2;
  }
  const std::string core = core_path();
  ::execv(core.c_str(), argv);
  fsdp::app::write_error_block(
      "cannot run '" + core + "': " + std::strerror(errno),
      "fsdp-train-core must sit next to fsdp-train: build the fsdp-train target (it builds "
      "both) and copy both executables together");
  return 1;
}
