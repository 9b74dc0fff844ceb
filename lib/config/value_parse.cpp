// Strict number/bool parsing with messages that name the flag or YAML key (value_parse.h).
#include "config/value_parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"

namespace fsdp::config::detail {

std::string to_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int64_t parse_int(const std::string& text, const std::string& source) {
  int64_t v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec == std::errc() && p == e && !text.empty()) return v;
  // Accept integral values written in float notation ("1e3", "16.0") as users of YAML do.
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(d) &&
      d == std::floor(d) && std::fabs(d) < 9.0e18) {
    return static_cast<int64_t>(d);
  }
  // A whole number too large for 64 bits ("99999999999999999999", "1e30"): out of range.
  const bool digits = ec == std::errc::result_out_of_range && p == e;
  const bool big = !text.empty() && end == text.c_str() + text.size() &&
                   (std::isinf(d) || (d == std::floor(d) && std::fabs(d) >= 9.0e18));
  FSDP_USAGE_CHECK(
      !(digits || big),
      str(source, ": '", text.size() > 40 ? text.substr(0, 40) + "..." : text, "' is out of range"),
      "write a whole number of sensible size (the limits are in docs/usage.md)");
  FSDP_USAGE_FAIL(str(source, ": '", text.size() > 40 ? text.substr(0, 40) + "..." : text,
                      "' is not an integer"),
                  "write a whole number, e.g. 16");
}

double parse_float(const std::string& text, const std::string& source) {
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  FSDP_USAGE_CHECK(!text.empty() && end == text.c_str() + text.size(),
                   str(source, ": '", text, "' is not a number"), "write e.g. 1e-4 or 0.5");
  FSDP_USAGE_CHECK(std::isfinite(d), str(source, ": '", text, "' is not a finite number"),
                   "use a finite value");
  return d;
}

bool parse_bool(const std::string& text, const std::string& source) {
  const std::string t = to_lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  FSDP_USAGE_FAIL(str(source, ": '", text, "' is not a boolean"), "write true or false");
}

std::string format_float(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general);
  return std::string(buf, p);
}

bool is_null_text(const std::string& text) {
  const std::string t = to_lower(text);
  return t.empty() || t == "none" || t == "null" || t == "~";
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace fsdp::config::detail
