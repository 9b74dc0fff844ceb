// libFuzzer entry for the torch.save archive reader (run_libfuzzer.sh builds it with clang and
// -fsanitize=fuzzer,address,undefined). With -seeds=DIR it writes the seed corpus and exits.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp::fuzz::run_torch_archive(data, size);
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp((*argv)[i], "-seeds=", 7) != 0) continue;
    const std::string dir = (*argv)[i] + 7;
    int k = 0;
    for (const std::string& s : fsdp::fuzz::torch_archive_seeds()) {
      std::ofstream(dir + "/seed" + std::to_string(k++), std::ios::binary) << s;
    }
    std::exit(0);
  }
  return 0;
}
