// Bounded gunzip of one file into memory (SpecForge's `--compress` feature files, .ckpt.gz). The
// file is read in fixed-size chunks and inflated as a stream; the output never exceeds a ceiling,
// and a truncated or corrupt stream is an error, never a short result. Pure C++ and zlib.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/zip_reader.h"

namespace fsdp {

struct GzipLimits {
  // The expanded file may not exceed this many bytes (one feature sample; SpecForge#426's
  // gpt-oss-120B samples at 64k tokens are 1.17 GB).
  uint64_t max_output = uint64_t{64} << 30;
};

// Inflates every gzip member of `path` (concatenated members are one stream, as gzip -d reads
// them). Throws ZipIoError when the file cannot be opened or read, FormatError when it is not
// gzip, is truncated, fails its CRC-32/length check, or expands past the limit. With
// `compressed_bytes`, stores the bytes read from the file.
std::vector<char> gunzip_file(const std::string& path, const GzipLimits& limits = {},
                              uint64_t* compressed_bytes = nullptr);

// Same over bytes in memory (tests and fuzzing).
std::vector<char> gunzip_bytes(const std::vector<char>& bytes, const GzipLimits& limits = {});

}  // namespace fsdp
