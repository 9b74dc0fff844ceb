// Every numeric flag of the option table, fed its extremes (0, -1, INT64_MAX, INT64_MIN, 1e30,
// a huge string of digits, nan, inf) through parsing and validation: either accepted or a
// UsageError that names the flag and has a hint; never another exception (std::out_of_range,
// an overflow). Plus the bounds that matter most (--dist-timeout: a week), the YAML and
// ds_config paths, and the W&B names checked at start-up.
#include <limits>
#include <stdexcept>

#include "config/train_config.h"
#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::require_refused;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;
using fsdp::config::test::validate_args;

namespace {

bool is_numeric(OptionKind k) {
  return k == OptionKind::kInt || k == OptionKind::kOptInt || k == OptionKind::kFloat ||
         k == OptionKind::kOptFloat;
}

}  // namespace

TEST_CASE("every numeric flag survives its extremes: accepted or a usage error naming it",
          "[config]") {
  const std::vector<std::string> extremes = {"0",
                                             "-1",
                                             std::to_string(std::numeric_limits<int64_t>::max()),
                                             std::to_string(std::numeric_limits<int64_t>::min()),
                                             "9223372036854775808",  // INT64_MAX + 1
                                             "1e30",
                                             "-1e30",
                                             "1e308",
                                             std::string(400, '9'),
                                             "nan",
                                             "inf"};
  int numeric = 0, refused = 0;
  for (const auto& spec : option_table()) {
    if (!is_numeric(spec.kind)) continue;
    ++numeric;
    for (const auto& value : extremes) {
      const std::string arg = spec.flag() + "=" + value;
      INFO("argument: " << arg);
      try {
        validate_args({arg});
      } catch (const fsdp::UsageError& e) {
        ++refused;
        const std::string text = e.message();
        INFO("error: " << text << " | hint: " << e.hint());
        const bool names_flag =
            text.find(spec.flag()) != std::string::npos ||
            (!spec.alias_of.empty() && text.find("--" + spec.alias_of) != std::string::npos);
        CHECK(names_flag);
        CHECK_FALSE(e.hint().empty());
      } catch (const std::exception& e) {
        FAIL("not a usage error: " << e.what());
      }
    }
  }
  CHECK(numeric >= 30);  // the table's numeric rows were all found
  CHECK(refused > numeric * 5);
}

TEST_CASE("numeric flags have upper bounds checked at start-up", "[config]") {
  // A week of minutes is the most a collective may wait (minutes -> ms must not overflow).
  CHECK_NOTHROW(validate_args({"--dist-timeout", "10080"}));
  require_refused({"--dist-timeout", "10081"}, "--dist-timeout 10081 is above its maximum 10080");
  require_refused({"--dist-timeout", "999999999999"}, "--dist-timeout");
  require_refused({"--dist-timeout", "99999999999999999999999"},
                  "--dist-timeout: '99999999999999999999999' is out of range");
  require_refused({"--threads", "100000"}, "--threads 100000");
  require_refused({"--num-epochs", "1e30"}, "--num-epochs: '1e30' is out of range");
  require_refused({"--max-length", "9223372036854775807"},
                  "--max-length 9223372036854775807 is above its maximum");
  require_refused(
      {"--draft-global-batch-size", "9223372036854775807", "--draft-micro-batch-size", "1"},
      "--draft-global-batch-size 9223372036854775807 is above its maximum");
  require_refused({"--dataloader-num-workers", "100000"},
                  "--dataloader-num-workers 100000 is above its maximum 64");
  require_refused({"--mfu-peak-tflops", "1e300"}, "--mfu-peak-tflops 1e+300 is above its maximum");
  // Range errors say what to do.
  require_refused({"--keep-last", "-1"}, "a whole number from 0 to");
  require_refused({"--adam-beta1", "1"}, "e.g. 0.9");
}

TEST_CASE("YAML and ds_config numbers out of range are usage errors naming the key", "[config]") {
  TrainConfig cfg;
  require_usage_error(
      [&] { apply_yaml_text("dist_timeout: 99999999999999999999999\n", "run.yaml", &cfg); },
      "dist_timeout");
  const std::string dir = fsdp::config::test::scratch_dir("numeric_limits");
  const std::string ds = dir + "/ds.json";
  fsdp::config::test::write_file(ds, R"({"train_micro_batch_size_per_gpu": 1e30})");
  require_usage_error([&] { resolve_args({"--deepspeed", ds}); }, "train_micro_batch_size_per_gpu");
  fsdp::config::test::write_file(ds, R"({"train_micro_batch_size_per_gpu": 4611686018427387904,
              "gradient_accumulation_steps": 4611686018427387904})");
  ResolveOptions ro;
  ro.world_size = 8;
  require_usage_error([&] { resolve_args({"--deepspeed", ds}, ro); }, "is outside [1, 16777216]");
}

TEST_CASE("W&B project and run names are checked at start-up", "[config]") {
  CHECK_NOTHROW(validate_args(
      {"--report-to", "wandb", "--wandb-project", "eagle3-llama_3.1", "--wandb-name", "run 1/a"}));
  for (const char* bad : {"../../x", "a\\b", "a#b", "a?b", "a%b", "a:b"}) {
    require_refused({"--report-to", "wandb", "--wandb-project", bad}, "--wandb-project '");
  }
  require_refused({"--report-to", "wandb", "--wandb-project", std::string(129, 'p')},
                  "--wandb-project is 129 characters long");
  CHECK_NOTHROW(validate_args({"--report-to", "wandb", "--wandb-project", std::string(128, 'p')}));
  require_refused({"--report-to", "wandb", "--wandb-name", std::string(200, 'n')},
                  "--wandb-name is 200 characters long");
  require_refused({"--report-to", "wandb", "--wandb-name", "two\nlines"},
                  "--wandb-name contains a control character");
}
