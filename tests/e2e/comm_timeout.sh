#!/usr/bin/env bash
# A rank that never arrives: the job must abort within timeout + a few seconds, non-zero, with
# a message naming the collective and the missing rank.
set -uo pipefail
BUILD="$1"
MPIEXEC="${FSDP_MPIEXEC:-mpiexec}"
log="$(mktemp)"
start=$(date +%s)
timeout 60 "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n 3 \
  "$BUILD/tests/comm_timeout_probe" >"$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "job exited 0"
[ "$rc" -ne 124 ] || fail "job hung until the outer timeout"
grep -qE "all_reduce\(sum\).*'world'" "$log" || fail "message does not name the collective"
grep -qE "arrive: \[2\]" "$log" || fail "message does not name rank 2"
grep -q "completed (unexpected)" "$log" && fail "a rank passed the collective"
[ "$elapsed" -le 20 ] || fail "took ${elapsed}s (timeout 2s + start-up)"
echo "PASS: aborted in ${elapsed}s with rc=$rc"
