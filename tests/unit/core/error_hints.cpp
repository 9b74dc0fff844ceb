// Every error fsdp-train raises tells the user what to do (a "---> HINT:" line): scans lib/ and
// apps/ for FSDP_CHECK / FSDP_USAGE_CHECK / throw_error / throw_usage_error (hint = last
// argument) and for the exception constructors taking (message, hint, file, line) (hint = second
// argument), and fails listing file:line for each whose hint is the empty literal "".
// FSDP_HINT_SCAN_ROOT overrides the repository root (to check the scanner on another tree).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include "support/test_paths.h"

namespace {

namespace fs = std::filesystem;

// Comments blanked out (newlines kept, so line numbers hold); string and char literals kept.
std::string strip_comments(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (s.compare(i, 2, "//") == 0) {
      while (i < n && s[i] != '\n') {
        out += ' ';
        ++i;
      }
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t end = s.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? n : end + 2;
      for (; i < stop; ++i) out += s[i] == '\n' ? '\n' : ' ';
    } else if (s[i] == '"' && i > 0 && s[i - 1] == 'R') {  // raw string R"delim( ... )delim"
      const size_t open = s.find('(', i);
      const std::string close = ")" + s.substr(i + 1, open - i - 1) + "\"";
      const size_t end = s.find(close, open);
      const size_t stop = end == std::string::npos ? n : end + close.size();
      out.append(s, i, stop - i);
      i = stop;
    } else if (s[i] == '"' || s[i] == '\'') {
      const char q = s[i];
      size_t j = i + 1;
      while (j < n && s[j] != q) j += s[j] == '\\' ? 2 : 1;
      j = std::min(n, j + 1);
      out.append(s, i, j - i);
      i = j;
    } else {
      out += s[i++];
    }
  }
  return out;
}

// The top-level arguments of the call whose '(' is at s[open]; empty if unbalanced.
std::vector<std::string> call_args(const std::string& s, size_t open) {
  std::vector<std::string> args;
  int depth = 0;
  size_t start = open + 1;
  for (size_t j = open; j < s.size(); ++j) {
    const char c = s[j];
    if (c == '"' || c == '\'') {
      size_t k = j + 1;
      while (k < s.size() && s[k] != c) k += s[k] == '\\' ? 2 : 1;
      j = k;
      continue;
    }
    if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      if (--depth == 0) {
        args.push_back(s.substr(start, j - start));
        return args;
      }
    } else if (c == ',' && depth == 1) {
      args.push_back(s.substr(start, j - start));
      start = j + 1;
    }
  }
  return {};
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// The word before position i (skipping blanks), e.g. "throw" in "throw Error(".
std::string word_before(const std::string& s, size_t i) {
  size_t e = i;
  while (e > 0 && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  size_t b = e;
  while (b > 0 && ident_char(s[b - 1])) --b;
  return s.substr(b, e - b);
}

// name -> index of the hint argument (-1: the last one).
const std::map<std::string, int>& call_forms() {
  static const std::map<std::string, int> forms = {{"FSDP_CHECK", -1},
                                                   {"FSDP_USAGE_CHECK", -1},
                                                   {"throw_error", -1},
                                                   {"throw_usage_error", -1},
                                                   {"Error", 1},
                                                   {"UsageError", 1},
                                                   {"CheckpointWriteError", 1},
                                                   {"BadSampleError", 1},
                                                   {"SampleReadError", 1}};
  return forms;
}

// "file:line: NAME" for each call with an empty hint in one file's text.
std::vector<std::string> empty_hints(const std::string& rel, const std::string& text) {
  std::vector<std::string> found;
  const std::string s = strip_comments(text);
  for (size_t i = 0; i < s.size(); ++i) {
    if (!ident_char(s[i]) || (i > 0 && ident_char(s[i - 1]))) continue;
    size_t e = i;
    while (e < s.size() && ident_char(s[e])) ++e;
    const std::string name = s.substr(i, e - i);
    const auto form = call_forms().find(name);
    size_t p = e;
    while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
    if (form == call_forms().end() || p >= s.size() || s[p] != '(') {
      i = e - 1;
      continue;
    }
    // Skip declarations and definitions ("void throw_error(", "#define FSDP_CHECK(",
    // "Error(std::string what, ..."): a call follows throw/return/new, an operator or a '('.
    const std::string before = word_before(s, i);
    const bool decl = !before.empty() && before != "throw" && before != "return" &&
                      before != "new" && before != "do" && before != "else";
    const bool is_macro_def = before == "define";
    if (!decl && !is_macro_def) {
      const auto args = call_args(s, p);
      const int idx = form->second < 0 ? static_cast<int>(args.size()) - 1 : form->second;
      if (idx >= 0 && idx < static_cast<int>(args.size()) && trim(args[idx]) == "\"\"") {
        const long line = 1 + std::count(s.begin(), s.begin() + static_cast<long>(i), '\n');
        found.push_back(rel + ":" + std::to_string(line) + ": " + name);
      }
    }
    i = e - 1;
  }
  return found;
}

fs::path scan_root() {
  if (const char* r = std::getenv("FSDP_HINT_SCAN_ROOT"); r && *r) return r;
  return FSDP_SOURCE_DIR;
}

}  // namespace

TEST_CASE("the hint scanner finds empty hints in every call form", "[cpu]") {
  const std::string src =
      "// FSDP_CHECK(a, \"in a comment\", \"\");\n"
      "void throw_error(const char* file, int line, const std::string& m, const std::string& h);\n"
      "FSDP_CHECK(x > 0, str(\"x(\", x, \")\"), \"set --x\");\n"
      "FSDP_CHECK(f(a, b) == 0,\n   \"call, failed\", \"\");\n"
      "FSDP_USAGE_CHECK(ok, \"msg\", \"\" );\n"
      "throw_usage_error(__FILE__, __LINE__, \"m\", \"\");\n"
      "throw BadSampleError(where + \": bad\", \"\", __FILE__, __LINE__);\n"
      "throw SampleReadError(\"m\", \"retry\", __FILE__, __LINE__);\n"
      "const char* s = \"FSDP_CHECK(a, b, \\\"\\\")\";\n";
  const auto found = empty_hints("x.cpp", src);
  REQUIRE(found.size() == 4);
  CHECK(found[0] == "x.cpp:4: FSDP_CHECK");
  CHECK(found[1] == "x.cpp:6: FSDP_USAGE_CHECK");
  CHECK(found[2] == "x.cpp:7: throw_usage_error");
  CHECK(found[3] == "x.cpp:8: BadSampleError");
}

TEST_CASE("every error raised in lib/ and apps/ has a non-empty hint", "[cpu]") {
  const fs::path root = scan_root();
  std::vector<std::string> missing;
  size_t files = 0;
  for (const char* top : {"lib", "apps"}) {
    REQUIRE(fs::is_directory(root / top));
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const auto ext = entry.path().extension();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      ++files;
      for (auto& m : empty_hints(fs::relative(entry.path(), root).string(), text.str()))
        missing.push_back(std::move(m));
    }
  }
  CHECK(files > 20);
  std::string list;
  for (const auto& m : missing) list += "  " + m + "\n";
  INFO("calls whose hint argument is \"\" (give each a hint telling the user what to do):\n"
       << list);
  CHECK(missing.empty());
}
