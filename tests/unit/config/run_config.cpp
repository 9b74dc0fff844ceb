// run_config.yaml is written completely or not at all: a full disk (here a file size limit, which
// fails writes with EFBIG as a full disk does with ENOSPC) is a UsageError naming the file, and
// the previous file stays as it was, with no temporary file left behind.
#include "config/run_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config_test_util.h"
#include "support/file_size_limit.h"

using namespace fsdp::config;
using fsdp::config::test::require_usage_error;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_CASE("run_config.yaml: a full disk is an error naming the file, never a cut file",
          "[config]") {
  const std::string dir = fsdp::config::test::scratch_dir("run_config");
  TrainConfig cfg;
  cfg.checkpoint.output_dir = dir;
  const std::string path = write_run_config(cfg);
  CHECK(path == dir + "/run_config.yaml");
  const std::string first = read_all(path);
  CHECK(first == to_yaml(with_absolute_paths(cfg)));
  CHECK(first.size() > 100);

  cfg.optim.learning_rate = 5e-4;
  fsdp::testing::with_file_size_limit(
      16, [&] { require_usage_error([&] { write_run_config(cfg); }, "cannot write " + path); });
  CHECK(read_all(path) == first);  // the earlier file, whole
  CHECK_FALSE(std::filesystem::exists(dir + "/.run_config.yaml.tmp"));

  // A directory that is gone (or not writable): the same error, also naming the file.
  cfg.checkpoint.output_dir = dir + "/missing";
  require_usage_error([&] { write_run_config(cfg); }, "run_config.yaml");
  // With room, the new configuration replaces the old one.
  cfg.checkpoint.output_dir = dir;
  write_run_config(cfg);
  CHECK(read_all(path).find("learning_rate: 0.0005") != std::string::npos);
}
