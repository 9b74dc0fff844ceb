// Text-to-value conversions shared by the command line, YAML and ds_config paths, so that a bad
// number reads the same wherever it came from. Internal to lib/config; never prints anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::config::detail {

// Each throws UsageError "<source>: '<text>' is not ..." naming where the text came from.
int64_t parse_int(const std::string& text, const std::string& source);
double parse_float(const std::string& text, const std::string& source);
bool parse_bool(const std::string& text, const std::string& source);
// Shortest text that parses back to the same double ("0.0001", "1e-08").
std::string format_float(double v);
// "none", "null", "~" and "" mean "unset" for optional values.
bool is_null_text(const std::string& text);
// Splits "a,b c" on commas and whitespace, dropping empty parts.
std::vector<std::string> split_list(const std::string& text);
// Levenshtein distance (for "did you mean").
size_t edit_distance(const std::string& a, const std::string& b);
std::string to_lower(std::string s);

}  // namespace fsdp::config::detail
