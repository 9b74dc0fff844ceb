// The one table of environment variables fsdp-train reads (name, type, default, meaning) and the
// only place in lib/ and apps/ that calls getenv: docs/usage.md's list is generated from the
// table, and unit.core.env keeps the two equal and finds getenv calls elsewhere. env.cpp uses
// the C++ standard library only, so the launcher can link it without LibTorch; it never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace fsdp::env {

enum class Type {
  kText,      // free text
  kPath,      // a file or directory
  kInteger,   // a whole number within [min, max]
  kChoice,    // one of `choices` (case-insensitive)
  kPresence,  // only whether it is set (and non-empty) matters
};

struct Variable {
  const char* name;
  Type type;
  // The value used when the variable is unset, as the docs show it. For kInteger a number here
  // is the default integer() returns (so the default has one source); any other text
  // ("unset", "the cores divided by ranks") means there is no default value.
  const char* default_text;
  const char* meaning;  // one line for docs/usage.md
  int64_t min = 0;      // kInteger: the accepted range
  int64_t max = 0;
  std::vector<std::string> choices = {};  // kChoice
};

// The table, in the order of docs/usage.md.
const std::vector<Variable>& variables();
// The row of `name`. A name missing from the table is a bug in fsdp-train: it prints the name
// and aborts (unit.core.env checks that every name the sources read is in the table).
const Variable& variable(std::string_view name);

// The value of `name` (which must be in the table); nullopt when unset or empty.
std::optional<std::string> text(std::string_view name);
// Set to a non-empty value.
bool is_set(std::string_view name);

// The integer parser of every environment value: an optional sign and decimal digits, nothing
// else (no spaces, no "1e3", no "16.0"), within int64. nullopt otherwise.
std::optional<int64_t> parse_integer(std::string_view text);

// A value read against its row, without throwing: `error` (naming the variable) and `hint` are
// set when the value is unusable. The launcher, which has no fsdp::Error, reports these itself.
struct Reading {
  std::optional<int64_t> integer;   // kInteger: the value, else the row's numeric default
  std::optional<std::string> text;  // kChoice (lower-cased) / kText / kPath: the value, if set
  std::string error;
  std::string hint;
};
Reading read(std::string_view name);

// For code that links fsdp_core: the integer (the row's default when unset; nullopt when the row
// has none), a bad value a UsageError (exit 2) naming the variable with a hint.
inline std::optional<int64_t> integer(std::string_view name) {
  Reading r = read(name);
  FSDP_USAGE_CHECK(r.error.empty(), r.error, r.hint);
  return r.integer;
}
// The same for kChoice rows: the value lower-cased, nullopt when unset.
inline std::optional<std::string> choice(std::string_view name) {
  Reading r = read(name);
  FSDP_USAGE_CHECK(r.error.empty(), r.error, r.hint);
  return r.text;
}

// The host allocator this process runs with: "jemalloc" when the front preloaded it
// (FSDP_ALLOCATOR), else "glibc malloc".
std::string allocator_in_use();

// The generated list for docs/usage.md (a Markdown table).
std::string usage_markdown();

}  // namespace fsdp::env
