// The fuzz targets: each feeds one input to one reader of untrusted files and must either
// accept it or throw the reader's documented error type. Anything else (a crash, a sanitizer
// report, another exception type) is a finding. Shared by the seeded mutational driver
// (fuzz_driver.cpp, built with the suite) and, for the pure-C++ archive target, libFuzzer
// (libfuzzer_archive.cpp, built with clang by run_libfuzzer.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::fuzz {

struct Target {
  const char* name;
  // Runs the reader on the input; returns normally on acceptance or on the documented error.
  void (*run)(const uint8_t* data, size_t size);
  // Well-formed seeds the mutations start from.
  std::vector<std::string> (*seeds)();
};

// Pure C++ (zip + pickle + tensor records): the libFuzzer target.
void run_torch_archive(const uint8_t* data, size_t size);
std::vector<std::string> torch_archive_seeds();

}  // namespace fsdp::fuzz
