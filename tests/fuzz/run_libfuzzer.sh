#!/usr/bin/env bash
# Builds the torch.save archive reader's libFuzzer target with clang (-fsanitize=fuzzer,address,
# undefined: coverage-guided, every out-of-bounds read or undefined behaviour is a finding) and
# runs it for SECONDS from the seed corpus. Exit 77 (skipped) when clang's libFuzzer runtime is
# not installed; launch/setup.sh installs it (Debian: clang, libclang-rt-14-dev).
#   bash tests/fuzz/run_libfuzzer.sh WORK_DIR [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:?usage: run_libfuzzer.sh WORK_DIR [SECONDS]}"
SECONDS_BUDGET="${2:-60}"
shift $(( $# >= 2 ? 2 : $# ))
CLANG="${FSDP_CLANGXX:-$(command -v clang++-14 || command -v clang++ || true)}"
if [ -z "$CLANG" ]; then
  echo "SKIP: no clang++ (install clang)"
  exit 77
fi
mkdir -p "$WORK/corpus" "$WORK/findings"
BIN="$WORK/libfuzzer_archive"
SOURCES=("$SRC/tests/fuzz/libfuzzer_archive.cpp" "$SRC/tests/fuzz/archive_target.cpp"
  "$SRC/lib/core/zip_reader.cpp" "$SRC/lib/core/pickle_reader.cpp" "$SRC/lib/core/torch_archive.cpp")
# Rebuild when a source is newer than the binary.
stale=0
[ -x "$BIN" ] || stale=1
for s in "${SOURCES[@]}" "$SRC/lib/core/"*.h "$SRC/tests/support/hostile_archives.h"; do
  [ "$s" -nt "$BIN" ] && stale=1
done
if [ "$stale" = 1 ]; then
  if ! "$CLANG" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
      -I"$SRC/lib" -I"$SRC/tests" "${SOURCES[@]}" -lz -o "$BIN.tmp" 2>"$WORK/build.log"; then
    if grep -c "libclang_rt.fuzzer\|fuzzer" "$WORK/build.log" >/dev/null &&
       ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
      echo "SKIP: clang's libFuzzer runtime is not installed"
      exit 77
    fi
    cat "$WORK/build.log" >&2
    exit 1
  fi
  mv "$BIN.tmp" "$BIN"
fi
"$BIN" -seeds="$WORK/corpus"
# A fixed seed: the same run finds the same inputs; -max_len bounds one input.
"$BIN" "$WORK/corpus" -max_total_time="$SECONDS_BUDGET" -seed=1 -max_len=65536 -rss_limit_mb=2048 \
  -artifact_prefix="$WORK/findings/" -print_final_stats=1 "$@"
