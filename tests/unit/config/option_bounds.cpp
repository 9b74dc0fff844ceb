// Option bounds live in the option table: every numeric option has them (--seed excepted), a
// value is checked against them wherever it comes from (flag, YAML, a configuration built in
// code), docs/usage.md's limits table is generated from them (FSDP_UPDATE_DOCS=1 rewrites it),
// and every --flag that a message, hint or help text in lib/ and apps/ tells users about exists.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "config_test_util.h"
#include "support/generated_doc.h"
#include "support/test_paths.h"

using namespace fsdp::config;
using fsdp::config::test::kRequiredFlags;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;

namespace {

namespace fs = std::filesystem;

bool is_integer(const OptionSpec& s) {
  return s.kind == OptionKind::kInt || s.kind == OptionKind::kOptInt;
}
bool is_numeric(const OptionSpec& s) {
  return is_integer(s) || s.kind == OptionKind::kFloat || s.kind == OptionKind::kOptFloat;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The string literals of a C++ source (comments skipped), each with its line number.
std::vector<std::pair<int, std::string>> string_literals(const std::string& s) {
  std::vector<std::pair<int, std::string>> out;
  int line = 1;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '\n') {
      ++line;
      ++i;
    } else if (s.compare(i, 2, "//") == 0) {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t e = s.find("*/", i + 2);
      const size_t stop = e == std::string::npos ? s.size() : e + 2;
      for (; i < stop; ++i) line += s[i] == '\n';
    } else if (s[i] == '\'') {
      i += s.compare(i, 3, "'\"'") == 0 ? 3 : 1;  // the character literal '"' opens no string
    } else if (s[i] == '"') {
      size_t j = i + 1;
      std::string lit;
      while (j < s.size() && s[j] != '"' && s[j] != '\n') {
        if (s[j] == '\\' && j + 1 < s.size()) lit += s[j++];
        lit += s[j++];
      }
      out.emplace_back(line, lit);
      i = j + 1;
    } else {
      ++i;
    }
  }
  return out;
}

std::vector<std::string> sources(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(std::string(FSDP_SOURCE_DIR) + "/" + dir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".cpp" || ext == ".h")) files.push_back(e.path().string());
  }
  return files;
}

}  // namespace

TEST_CASE("every numeric option has bounds in the table", "[config]") {
  int bounded = 0;
  for (const auto& spec : option_table()) {
    if (!is_numeric(spec) || !spec.alias_of.empty()) continue;
    INFO(spec.flag());
    if (spec.name == "seed") {  // any 64-bit seed is a seed
      CHECK_FALSE(spec.bounds.has_value());
      continue;
    }
    // SpecForge flags that are only recorded (--tp-size, --min-pixels, ...) are not options of
    // fsdp-train: each has its own rule (only 1, or positive) and keeps the text it was given.
    if (spec.cli_only && spec.group == "SpecForge compatibility") continue;
    REQUIRE(spec.bounds.has_value());
    CHECK(spec.bounds->min <= spec.bounds->max);
    // The default is inside the bounds.
    static const TrainConfig defaults;
    CHECK_NOTHROW(spec.check_value(defaults));
    ++bounded;
  }
  CHECK(bounded >= 28);
}

TEST_CASE("integer options accept their bounds and refuse one past them", "[config]") {
  for (const auto& spec : option_table()) {
    if (!is_integer(spec) || !spec.bounds || spec.kind == OptionKind::kResume) continue;
    const auto lo = static_cast<int64_t>(spec.bounds->min);
    const auto hi = static_cast<int64_t>(spec.bounds->max);
    for (int64_t ok : {lo, hi}) {
      INFO(spec.flag() << " " << ok);
      CHECK_NOTHROW(resolve_args({spec.flag(), std::to_string(ok)}));
    }
    for (int64_t bad : {lo - 1, hi + 1}) {
      INFO(spec.flag() << " " << bad);
      try {
        resolve_args({spec.flag(), std::to_string(bad)});
        FAIL("accepted");
      } catch (const fsdp::UsageError& e) {
        CHECK(e.message().find(spec.flag()) == 0);
        // The hint names the range, or says what to give instead.
        CHECK(e.hint().size() > 10);
      }
    }
  }
}

TEST_CASE("bounds are checked for YAML keys and for configurations built in code", "[config]") {
  TrainConfig cfg;
  require_usage_error([&] { apply_yaml_text("max_length: 1\n", "run.yaml", &cfg); },
                      "run.yaml:1 max_length 1 is below its minimum 2");
  require_usage_error([&] { apply_yaml_text("learning_rate: 1.5\n", "run.yaml", &cfg); },
                      "learning_rate 1.5 is outside (0, 1)");
  TrainConfig built = resolve_args(kRequiredFlags);
  ValidateOptions vo;
  vo.check_paths = false;
  CHECK_NOTHROW(validate(built, 1, vo));
  built.data.max_length = 1;  // the loader needs a token and its successor
  require_usage_error([&] { validate(built, 1, vo); }, "--max-length 1 is below its minimum 2");
  built.data.max_length = 2;
  built.optim.adam_eps = 0;
  require_usage_error([&] { validate(built, 1, vo); }, "--adam-eps 0 is outside (0, 1]");
}

TEST_CASE("docs/usage.md's limits table is generated from the bounds", "[config]") {
  const std::string want = usage_limits_markdown();
  fsdp::test::check_generated_section(
      std::string(FSDP_SOURCE_DIR) + "/docs/usage.md",
      "<!-- BEGIN GENERATED LIMITS (lib/config option table) -->\n",
      "<!-- END GENERATED LIMITS -->", want,
      "<build>/tests/unit_config \"[#option_bounds]\" --filenames-as-tags");
  CHECK(want.find("| `--dist-timeout` | 1..10080 |") != std::string::npos);
}

TEST_CASE("every --flag named in a message, hint or help text exists", "[config]") {
  // Flags of the option table, and flags apps/fsdp-train defines itself (subcommands, launcher):
  // a string literal that is exactly a flag, as CLI11 registrations and the launcher's own
  // parser spell them.
  std::set<std::string> defined = {"--help"};  // CLI11 gives every command and subcommand one
  for (const auto& spec : option_table()) defined.insert(spec.flag());
  const std::regex whole_flag("(--[a-z][a-z0-9-]+)(,.*)?");
  // Flags of other programs that fsdp-train passes on or tells users to type; each is not ours.
  const std::map<std::string, std::string> others = {
      {"--allow-run-as-root", "mpirun's (the launcher passes it when running as root)"},
      {"--oversubscribe", "mpirun's (more ranks than cores)"},
      {"--bind-to", "mpirun's (the launcher passes --bind-to none)"},
      {"--map-by", "mpirun's (ranks per node)"},
      {"--filenames-as-tags", "Catch2's (how to regenerate the docs)"},
      {"--include", "huggingface-cli download's (the hint for a model not in the cache)"},
      {"--name", "the placeholder of '--name VALUE' in the parse-error hint"},
      {"--compress", "SpecForge prepare_hidden_states's (how its .ckpt.gz files are made)"},
  };
  for (const auto& file : sources("apps")) {
    for (const auto& [line, lit] : string_literals(read_text(file))) {
      std::smatch m;
      if (std::regex_match(lit, m, whole_flag) && others.count(m[1].str()) == 0)
        defined.insert(m[1].str());
    }
  }
  CHECK(defined.count("--nproc-per-node") == 1);  // the launcher's flags were found
  CHECK(defined.count("--min-bytes") == 1);       // and the subcommands'
  const std::regex flag_re("(^|[^A-Za-z0-9-])(--[a-z][a-z0-9-]*)");
  int mentions = 0;
  for (const char* dir : {"lib", "apps"}) {
    for (const auto& file : sources(dir)) {
      const std::string rel = file.substr(std::string(FSDP_SOURCE_DIR).size() + 1);
      for (const auto& [line, lit] : string_literals(read_text(file))) {
        for (std::sregex_iterator it(lit.begin(), lit.end(), flag_re), end; it != end; ++it) {
          const std::string flag = (*it)[2].str();
          ++mentions;
          INFO(rel << ":" << line << " names " << flag << " in \"" << lit << "\"");
          CHECK((defined.count(flag) == 1 || others.count(flag) == 1));
        }
      }
    }
  }
  CHECK(mentions > 200);
}

TEST_CASE("ds_config batch sizes are bounded by the table's global batch bound", "[config]") {
  const auto max = static_cast<int64_t>(option("draft-global-batch-size").bounds->max);
  const std::string dir = fsdp::config::test::scratch_dir("option_bounds");
  const std::string ds = dir + "/ds.json";
  fsdp::config::test::write_file(
      ds, "{\"train_micro_batch_size_per_gpu\": " + std::to_string(max + 1) + "}");
  require_usage_error(
      [&] {
        resolve_args({"--deepspeed", ds});
      },
      "is outside [1, " + std::to_string(max) + "]");
}
