#!/usr/bin/env bash
# fsdp-train's Muon step on whole matrices against torch.optim.Muon (tests/e2e/torch_muon.py says
# how): parameters and momentum within 1e-6 relative over three steps, in three settings, and a
# negative control.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
W="$BUILD/e2e_work/torch_muon"; rm -rf "$W"; mkdir -p "$W"
TOOL="$BUILD/tests/muon_step"
[ -x "$TOOL" ] || fail "$TOOL is not built (ninja -C $BUILD muon_step)"
"$PY" "$SRC/tests/e2e/torch_muon.py" "$TOOL" "$W" >"$W/log" 2>&1; rc=$?
grep -E "PASS|FAIL|control" "$W/log"
[ $rc -eq 0 ] || { tail -30 "$W/log"; fail "fsdp-train's Muon differs from torch.optim.Muon"; }
[ "$(grep -c -- "-> PASS" "$W/log")" -eq 3 ] || fail "expected 3 passing cases"
echo PASS
