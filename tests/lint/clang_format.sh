#!/usr/bin/env bash
# lint.clang_format: every C++ source of the project is formatted as the checked-in .clang-format
# says (clang-format 14, Debian's clang-format package, installed by launch/setup.sh). Fails
# listing each file that differs and the command that fixes it. It first checks itself: a
# planted misformatted file must be reported.
# Usage: clang_format.sh [REPO_ROOT]
set -uo pipefail
ROOT="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
CF="$(command -v clang-format-14 || command -v clang-format)" ||
  { echo "FAIL: clang-format not found: run launch/setup.sh (it installs Debian's clang-format)"; exit 1; }

# differs FILE: 0 when clang-format would change FILE (the style file is found from FILE's folder).
differs() { ! "$CF" --dry-run -Werror "$1" >/dev/null 2>&1; }

scratch="$(mktemp -d)"; trap 'rm -rf "$scratch"' EXIT
cp "$ROOT/.clang-format" "$scratch/"
printf 'int  main( ){return 0 ;}\n' >"$scratch/planted.cpp"
"$CF" "$scratch/planted.cpp" >"$scratch/clean.cpp"
differs "$scratch/planted.cpp" || { echo "FAIL: self-check: a misformatted file was not reported"; exit 1; }
differs "$scratch/clean.cpp" && { echo "FAIL: self-check: a formatted file was reported"; exit 1; }

bad=0; n=0
while IFS= read -r -d '' f; do
  n=$((n + 1))
  if differs "$f"; then
    echo "${f#"$ROOT"/}: not clang-format clean (fix: clang-format -i ${f#"$ROOT"/})"
    bad=1
  fi
done < <(find "$ROOT/lib" "$ROOT/apps" "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/cmake" \
  -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp.in' \) \
  -not -path '*/build*' -print0)
[ "$n" -gt 100 ] || { echo "FAIL: found only $n C++ files under $ROOT"; exit 1; }
[ $bad -eq 0 ] || { echo "FAIL: files above differ from .clang-format"; exit 1; }
echo "ok: $n C++ files clang-format clean"
