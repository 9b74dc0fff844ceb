// Helpers shared by the lib/config unit tests: parse an argv through CLI11 and the option table,
// resolve it, and check that a UsageError carries the expected text. Test-only.
#pragma once

#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>

#include <ostream>
#include <string>
#include <vector>

#include "compat/resolve.h"
#include "config/options.h"
#include "config/train_config.h"
#include "core/error.h"
#include "support/test_paths.h"

namespace fsdp::config::test {

inline CommandLineValues parse_args(std::vector<std::string> args) {
  CLI::App app{"test", "fsdp-train"};
  TrainOptionsBinding binding;
  add_train_options(app, &binding);
  std::vector<const char*> argv{"fsdp-train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  return binding.values();
}

inline TrainConfig resolve_args(std::vector<std::string> args, ResolveOptions opts = {}) {
  return resolve(parse_args(std::move(args)), opts);
}

// The four required flags, with placeholder paths (validated with check_paths off).
inline const std::vector<std::string> kRequiredFlags = {
    "--target-model-path",        "/t", "--draft-model-config", "d.json",
    "--train-hidden-states-path", "/h", "--output-dir",         "/o"};

// kRequiredFlags + `extra`, resolved and validated for `world` ranks without touching the
// paths: what a UsageError test of one flag needs.
inline void validate_args(const std::vector<std::string>& extra, int world = 1) {
  std::vector<std::string> args = kRequiredFlags;
  args.insert(args.end(), extra.begin(), extra.end());
  const TrainConfig c = resolve_args(args);
  ValidateOptions vo;
  vo.check_paths = false;
  validate(c, world, vo);
}

// Runs `fn`, requires a UsageError whose message + hint contains `needle`.
template <class Fn>
void require_usage_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const UsageError& e) {
    const std::string all = e.message() + " | " + e.hint();
    INFO("error text: " << all);
    CHECK(all.find(needle) != std::string::npos);
    return;
  }
  FAIL("expected a UsageError containing: " << needle);
}

// kRequiredFlags + `extra` must fail validation for `world` ranks with a UsageError whose
// message + hint contains `needle`.
inline void require_refused(const std::vector<std::string>& extra, const std::string& needle,
                            int world = 1) {
  std::string flags;
  for (const auto& e : extra) flags += e + " ";
  INFO("flags: " << flags);
  require_usage_error([&] { validate_args(extra, world); }, needle);
}

// A scratch directory under the build tree, emptied first.
inline std::string scratch_dir(const std::string& name) {
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test-scratch/config/" + name;
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  return dir;
}

inline void write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

}  // namespace fsdp::config::test

// How Catch2 prints the closed sets held in lists when a check fails (found by argument-dependent
// lookup; LibTorch's operator<< for std::vector prints the items with it).
namespace fsdp::config {
inline std::ostream& operator<<(std::ostream& os, MetricSink s) {
  return os << option("report-to")
                   .get([&] {
                     TrainConfig c;
                     c.metrics.report_to = {s};
                     return c;
                   }())
                   .text;
}
}  // namespace fsdp::config

namespace fsdp::model {
inline std::ostream& operator<<(std::ostream& os, LoraTarget t) {
  return os << lora_target_name(t);
}
}  // namespace fsdp::model
