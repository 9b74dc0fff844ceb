// The docs follow the option table: docs/configuration.md is generated from it, docs/usage.md
// holds the generated flag reference, and every flag the program accepts (the table's and the
// ones registered in apps/fsdp-train) appears in docs/usage.md.
// FSDP_UPDATE_DOCS=1 rewrites the generated parts instead of failing.
#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "config_test_util.h"
#include "support/test_paths.h"

using namespace fsdp::config;

namespace {

const std::string kBegin = "<!-- BEGIN GENERATED FLAGS (lib/config option table) -->\n";
const std::string kEnd = "<!-- END GENERATED FLAGS -->";

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

bool updating() {
  const char* e = std::getenv("FSDP_UPDATE_DOCS");
  return e && std::string(e) == "1";
}

const std::string kHowToFix =
    "regenerate: FSDP_UPDATE_DOCS=1 <build>/tests/unit_config \"[#docs]\" --filenames-as-tags";

}  // namespace

TEST_CASE("docs/configuration.md is generated from the option table", "[config]") {
  const std::string path = std::string(FSDP_SOURCE_DIR) + "/docs/configuration.md";
  const std::string want = configuration_markdown();
  if (updating()) write(path, want);
  INFO(kHowToFix);
  CHECK(read(path) == want);
  const std::string doc = read(path);
  for (const auto& spec : option_table()) {
    if (spec.cli_only) continue;
    INFO(spec.yaml_key());
    CHECK(doc.find("`" + spec.yaml_key() + "`") != std::string::npos);
  }
}

TEST_CASE("docs/usage.md carries the generated flag reference", "[config]") {
  const std::string path = std::string(FSDP_SOURCE_DIR) + "/docs/usage.md";
  std::string doc = read(path);
  const size_t b = doc.find(kBegin);
  const size_t e = doc.find(kEnd);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  REQUIRE(b < e);
  const std::string current = doc.substr(b + kBegin.size(), e - b - kBegin.size());
  const std::string want = usage_flags_markdown() + "\n";
  if (updating() && current != want) {
    doc = doc.substr(0, b + kBegin.size()) + want + doc.substr(e);
    write(path, doc);
  }
  INFO(kHowToFix);
  CHECK(current == want);
}

TEST_CASE("every flag in --help and in apps/fsdp-train appears in docs/usage.md", "[config]") {
  const std::string doc = read(std::string(FSDP_SOURCE_DIR) + "/docs/usage.md");
  CLI::App app{"fsdp-train"};
  TrainOptionsBinding binding;
  add_train_options(app, &binding);
  std::set<std::string> flags;
  const std::string help = app.help();
  const std::regex flag_re("--[a-z][a-z0-9-]+");
  for (std::sregex_iterator it(help.begin(), help.end(), flag_re), end; it != end; ++it)
    flags.insert(it->str());
  // Flags registered by the subcommands and the launcher, straight from their sources.
  const std::regex reg_re(R"re("(--[a-z][a-z0-9-]+)[,"{])re");
  const std::string app_dir = std::string(FSDP_SOURCE_DIR) + "/apps/fsdp-train";
  std::vector<std::string> sources;
  if (DIR* d = ::opendir(app_dir.c_str())) {
    while (dirent* ent = ::readdir(d)) {
      const std::string n = ent->d_name;
      if (n.size() > 4 && n.substr(n.size() - 4) == ".cpp") sources.push_back(app_dir + "/" + n);
    }
    ::closedir(d);
  }
  REQUIRE(sources.size() >= 3);
  for (const auto& f : sources) {
    const std::string src = read(f);
    for (std::sregex_iterator it(src.begin(), src.end(), reg_re), end; it != end; ++it) {
      const std::string flag = (*it)[1].str();
      // mpirun's own flags that the launcher passes through are not ours.
      if (flag == "--allow-run-as-root" || flag == "--oversubscribe" || flag == "--bind-to" ||
          flag == "--map-by")
        continue;
      flags.insert(flag);
    }
  }
  CHECK(flags.size() > 50);
  for (const auto& f : flags) {
    INFO(f);
    CHECK(doc.find("`" + f) != std::string::npos);
  }
}
