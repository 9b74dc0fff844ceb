#!/usr/bin/env bash
# fsdp-train's DFlash draft and objective against SpecForge 0.2.0's own DFlashDraftModel and
# OnlineDFlashModel: the same weights, features and anchors; loss, terms, block outputs and every
# gradient within 1e-6 relative in float64, for full and sliding attention, the decay, chunking and
# the D-PACE losses (tests/e2e/specforge_dflash.py says how). A negative control checks that the
# comparison can fail.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
W="$BUILD/e2e_work/specforge_dflash"; rm -rf "$W"; mkdir -p "$W"
TOOL="$BUILD/tests/dflash_loss"
[ -x "$TOOL" ] || fail "$TOOL is not built (ninja -C $BUILD dflash_loss)"
"$PY" -c 'import specforge' 2>/dev/null ||
  fail "specforge is not installed in $PY's environment (bash launch/setup.sh installs it)"
"$PY" "$SRC/tests/e2e/specforge_dflash.py" "$TOOL" "$W" >"$W/log" 2>&1; rc=$?
grep -E "PASS|FAIL|control" "$W/log"
[ $rc -eq 0 ] || { tail -30 "$W/log"; fail "fsdp-train's DFlash differs from SpecForge's"; }
[ "$(grep -c -- "-> PASS" "$W/log")" -eq 7 ] || fail "expected 7 passing cases"
echo PASS
