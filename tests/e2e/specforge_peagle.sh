#!/usr/bin/env bash
# fsdp-train's P-EAGLE draft and step against SpecForge 0.2.0's own PEagleTrainStrategy and
# OnlinePEagleModel: the same weights, features and sampled rows; loss, per-sample terms, the
# per-depth accuracy counts and every gradient within 1e-6 relative, and the depth sampling drawn
# from the same seed equal to SpecForge's (tests/e2e/specforge_peagle.py says how). A negative
# control checks that the comparison can fail.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
W="$BUILD/e2e_work/specforge_peagle"; rm -rf "$W"; mkdir -p "$W"
TOOL="$BUILD/tests/peagle_step"
[ -x "$TOOL" ] || fail "$TOOL is not built (ninja -C $BUILD peagle_step)"
"$PY" -c 'import specforge' 2>/dev/null ||
  fail "specforge is not installed in $PY's environment (bash launch/setup.sh installs it)"
"$PY" "$SRC/tests/e2e/specforge_peagle.py" "$TOOL" "$W" >"$W/log" 2>&1; rc=$?
grep -E "PASS|FAIL|control" "$W/log"
[ $rc -eq 0 ] || { tail -30 "$W/log"; fail "fsdp-train's P-EAGLE differs from SpecForge's"; }
[ "$(grep -c -- "-> PASS" "$W/log")" -eq 4 ] || fail "expected 4 passing cases"
echo PASS
