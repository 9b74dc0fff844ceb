// Range checks of the loader's and the noise's options (loader_options.h). The flags' parser
// checks the same ranges when a value is given; these catch values set by code.
#include "data/loader_options.h"

#include <cmath>

#include "core/error.h"

namespace fsdp::data {

namespace {
const char* const kBug =
    "this is a bug in fsdp-train: please report it with the command line and log";
}  // namespace

void NoiseOptions::validate() const {
  const char* const hint =
      "give --noise-std 0 (off) or a small positive value, e.g. 0.05 (speculators' default); at "
      "most 100";
  FSDP_USAGE_CHECK(std::isfinite(std), str("--noise-std ", std, " is not a finite number"), hint);
  FSDP_USAGE_CHECK(std >= 0, str("--noise-std ", std, " is negative"), hint);
  FSDP_USAGE_CHECK(std <= kMaxStd, str("--noise-std ", std, " is above its maximum ", kMaxStd),
                   hint);
}

void LoaderOptions::validate() const {
  FSDP_USAGE_CHECK(
      max_length >= kMinMaxLength && max_length <= kMaxMaxLength,
      str("--max-length ", max_length, " is outside ", kMinMaxLength, "..", kMaxMaxLength),
      str("give --max-length a whole number from ", kMinMaxLength,
          " (a token and its successor) to ", kMaxMaxLength));
  FSDP_USAGE_CHECK(
      prefetch_threads <= kMaxThreads,
      str("--loader-threads ", prefetch_threads, " is above its maximum ", kMaxThreads),
      str("give --loader-threads a whole number from 0 to ", kMaxThreads,
          " (0: 1 on the CPU, 4 on a GPU)"));
  // --loader-threads 0 means "chosen by the trainer"; the loader gets the chosen count.
  FSDP_CHECK(prefetch_threads >= 1,
             str("loader: --loader-threads resolved to ", prefetch_threads, " reader threads"),
             "this is a bug in fsdp-train (0 is resolved before the loader starts): please "
             "report it with the command line and log");
  FSDP_CHECK(
      prefetch_depth >= 1 && prefetch_depth <= kMaxPrefetchDepth,
      str("loader: prefetch depth ", prefetch_depth, " is outside [1, ", kMaxPrefetchDepth, "]"),
      kBug);
  FSDP_USAGE_CHECK(read_retries >= 0 && retry_delay_s >= 0,
                   str("loader read retries ", read_retries, " / delay ", retry_delay_s,
                       " must not be negative"),
                   kBug);
  noise.validate();
}

}  // namespace fsdp::data
