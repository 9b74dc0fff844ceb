#!/usr/bin/env bash
# fsdp-train's draft model against SpecForge's own modeling code (specforge 0.2.0 from PyPI):
# the same weights and inputs, logits of every TTT step within 1e-6 relative in float32, for the
# plain EAGLE3 draft, EAGLE3.1's fc_norm, and fc_norm with norm_output as vLLM reads it
# (tests/e2e/specforge_modeling.py says how). A negative control checks the comparison can fail.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
W="$BUILD/e2e_work/specforge_modeling"; rm -rf "$W"; mkdir -p "$W"
TOOL="$BUILD/tests/draft_logits"
[ -x "$TOOL" ] || fail "$TOOL is not built (ninja -C $BUILD draft_logits)"
"$PY" -c 'import specforge' 2>/dev/null ||
  fail "specforge is not installed in $PY's environment (bash launch/setup.sh installs it)"
"$PY" "$SRC/tests/e2e/specforge_modeling.py" "$TOOL" "$W" >"$W/log" 2>&1; rc=$?
grep -E "worst|control" "$W/log"
[ $rc -eq 0 ] || { tail -30 "$W/log"; fail "fsdp-train's logits differ from SpecForge's modeling code"; }
[ "$(grep -c -- "-> PASS" "$W/log")" -eq 4 ] || fail "expected 4 passing cases"
echo PASS
