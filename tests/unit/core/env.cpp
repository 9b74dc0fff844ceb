// The environment-variable table (core/env.h): the one integer parser, reading against a row's
// type and bounds, the table's own consistency, docs/usage.md's generated list (FSDP_UPDATE_DOCS=1
// rewrites it), and that lib/ and apps/ read the environment only through the table.
#include "core/env.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "support/generated_doc.h"
#include "support/test_paths.h"
namespace {

namespace fs = std::filesystem;
using fsdp::env::Type;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sets (or with nullptr unsets) a variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Line comments and block comments blanked (string literals kept), so that a getenv in a
// comment is not a call.
std::string code_only(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != '"' && s[j] != '\n') j += s[j] == '\\' ? 2 : 1;
      out.append(s, i, std::min(s.size(), j + 1) - i);
      i = j + 1;
    } else if (s.compare(i, 2, "//") == 0) {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t e = s.find("*/", i + 2);
      i = e == std::string::npos ? s.size() : e + 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::vector<std::string> sources() {
  std::vector<std::string> files;
  for (const char* dir : {"lib", "apps"}) {
    for (const auto& e :
         fs::recursive_directory_iterator(std::string(FSDP_SOURCE_DIR) + "/" + dir)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".h")) files.push_back(e.path().string());
    }
  }
  return files;
}

std::string relative(const std::string& path) {
  return path.substr(std::string(FSDP_SOURCE_DIR).size() + 1);
}

}  // namespace

TEST_CASE("env::parse_integer takes a sign and decimal digits only", "[core]") {
  CHECK(fsdp::env::parse_integer("16") == 16);
  CHECK(fsdp::env::parse_integer("+16") == 16);
  CHECK(fsdp::env::parse_integer("-1") == -1);
  CHECK(fsdp::env::parse_integer("9223372036854775807") == INT64_MAX);
  for (const char* bad : {"", "+", "-", "+-1", " 4", "4 ", "1e3", "16.0", "0x10", "four",
                          "9223372036854775808", "99999999999999999999"}) {
    INFO("text: '" << bad << "'");
    CHECK_FALSE(fsdp::env::parse_integer(bad).has_value());
  }
}

TEST_CASE("env::read checks a value against its row", "[core]") {
  {
    ScopedEnv e("FSDP_PRETEND_NODES", nullptr);
    const auto r = fsdp::env::read("FSDP_PRETEND_NODES");
    CHECK(r.error.empty());
    CHECK_FALSE(r.integer.has_value());  // no numeric default: unset stays unset
  }
  {
    ScopedEnv e("FSDP_PRETEND_NODES", "");
    CHECK_FALSE(fsdp::env::is_set("FSDP_PRETEND_NODES"));  // empty counts as unset
    CHECK_FALSE(fsdp::env::read("FSDP_PRETEND_NODES").integer.has_value());
  }
  {
    ScopedEnv e("FSDP_PRETEND_NODES", "2");
    CHECK(fsdp::env::integer("FSDP_PRETEND_NODES") == 2);
  }
  for (const char* bad : {"0", "-2", "two", "2x", "1e3"}) {
    ScopedEnv e("FSDP_PRETEND_NODES", bad);
    INFO("value: " << bad);
    const auto r = fsdp::env::read("FSDP_PRETEND_NODES");
    CHECK(r.error.find("FSDP_PRETEND_NODES='") == 0);
    CHECK_FALSE(r.hint.empty());
    CHECK_THROWS_AS(fsdp::env::integer("FSDP_PRETEND_NODES"), fsdp::UsageError);
  }
  {
    // The default integer comes from the row, so the table is its one source.
    ScopedEnv e("FSDP_MPI_RS_ALLREDUCE_BYTES", nullptr);
    const auto& row = fsdp::env::variable("FSDP_MPI_RS_ALLREDUCE_BYTES");
    CHECK(fsdp::env::integer("FSDP_MPI_RS_ALLREDUCE_BYTES") ==
          fsdp::env::parse_integer(row.default_text));
  }
  {
    ScopedEnv e("FSDP_MPI_MAX_COUNT", "2147483648");  // above MPI's int count
    CHECK_THROWS_AS(fsdp::env::integer("FSDP_MPI_MAX_COUNT"), fsdp::UsageError);
  }
  {
    ScopedEnv e("FSDP_PROGRESS", "TTY");
    CHECK(fsdp::env::choice("FSDP_PROGRESS") == "tty");
  }
  {
    ScopedEnv e("FSDP_PROGRESS", "fancy");
    const auto r = fsdp::env::read("FSDP_PROGRESS");
    CHECK(r.error.find("FSDP_PROGRESS='fancy'") == 0);
    CHECK(r.hint.find("tty") != std::string::npos);
  }
}

TEST_CASE("the environment table is consistent", "[core]") {
  std::set<std::string> names;
  const std::regex name_re("[A-Z][A-Z0-9_]*");
  for (const auto& v : fsdp::env::variables()) {
    INFO(v.name);
    CHECK(names.insert(v.name).second);
    CHECK(std::regex_match(std::string(v.name), name_re));
    CHECK(std::string(v.meaning).size() > 10);
    CHECK_FALSE(std::string(v.default_text).empty());
    if (v.type == Type::kInteger) {
      CHECK(v.min <= v.max);
      if (const auto d = fsdp::env::parse_integer(v.default_text)) {
        CHECK(*d >= v.min);
        CHECK(*d <= v.max);
      }
    }
    if (v.type == Type::kChoice) CHECK(v.choices.size() >= 2);
  }
  CHECK(names.size() >= 20);
}

TEST_CASE("docs/usage.md lists the environment table", "[core]") {
  fsdp::test::check_generated_section(std::string(FSDP_SOURCE_DIR) + "/docs/usage.md",
                                      "<!-- BEGIN GENERATED ENVIRONMENT (lib/core/env.cpp) -->\n",
                                      "<!-- END GENERATED ENVIRONMENT -->",
                                      fsdp::env::usage_markdown(),
                                      "<build>/tests/unit_core \"[#env]\" --filenames-as-tags");
}

TEST_CASE("lib/ and apps/ read the environment only through the table", "[core]") {
  const std::regex getenv_re(R"(\bgetenv\s*\()");
  const std::regex literal_re(R"(getenv\s*\(\s*"([A-Za-z0-9_]+)\")");
  const std::regex read_re(
      R"(env::(?:text|integer|choice|is_set|read|variable)\s*\(\s*"([A-Za-z0-9_]+)\")");
  std::set<std::string> table;
  for (const auto& v : fsdp::env::variables()) table.insert(v.name);
  int reads = 0;
  for (const auto& file : sources()) {
    const std::string rel = relative(file);
    if (rel == "lib/core/env.cpp") continue;
    const std::string code = code_only(read_text(file));
    if (std::regex_search(code, getenv_re)) {
      INFO(rel << " calls getenv: read the variable with core/env.h (env::text, env::integer)");
      CHECK(false);
    }
    for (const auto* re : {&literal_re, &read_re}) {
      for (std::sregex_iterator it(code.begin(), code.end(), *re), end; it != end; ++it) {
        ++reads;
        INFO(rel << " reads " << (*it)[1].str());
        CHECK(table.count((*it)[1].str()) == 1);
      }
    }
  }
  CHECK(reads >= 15);
  // Variables named through constants (train/signals.h) rather than literals.
  for (const char* name : {"FSDP_RESTART_ATTEMPT", "FSDP_LAUNCH_ID"}) CHECK(table.count(name) == 1);
}
