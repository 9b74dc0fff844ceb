#!/usr/bin/env bash
# fsdp-train's DSpark objective against SpecForge's own OnlineDSparkModel and DSparkDraftModel
# heads (specforge 0.2.0 from PyPI): the same config, heads' weights, batch, anchors and backbone
# output; loss, every metric term and the gradients of hidden4d and every head parameter within
# 1e-6 relative in float32, for each Markov head variant, with and without the confidence head,
# chunked and unchunked, with and without the loss decay; and the whole step (backbone, heads and
# objective: SpecForge's OnlineDSparkModel.forward against fsdp-train's dspark_step), every draft
# parameter's gradient included (tests/e2e/specforge_dspark.py says how); and each block's
# accepted count (what evaluation's engine walk reads) exactly equal to the script's own count
# from SpecForge's draft logits, with runs of every length.
# Three negative controls check the comparison can fail.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
W="$BUILD/e2e_work/specforge_dspark"; rm -rf "$W"; mkdir -p "$W"
TOOL="$BUILD/tests/dspark_objective"
[ -x "$TOOL" ] || fail "$TOOL is not built (ninja -C $BUILD dspark_objective)"
"$PY" -c 'import specforge' 2>/dev/null ||
  fail "specforge is not installed in $PY's environment (bash launch/setup.sh installs it)"
"$PY" "$SRC/tests/e2e/specforge_dspark.py" "$TOOL" "$W" >"$W/log" 2>&1; rc=$?
grep -E "PASS|FAIL|control|cases|counts seen" "$W/log"
[ $rc -eq 0 ] || { tail -30 "$W/log"; fail "fsdp-train's DSpark objective differs from SpecForge's"; }
cases="$(sed -n 's/^cases \([0-9]*\)$/\1/p' "$W/log")"
[ -n "$cases" ] && [ "$cases" -ge 40 ] || fail "expected at least 40 cases, the log says '$cases'"
[ "$(grep -c -- "-> PASS" "$W/log")" -eq "$cases" ] || fail "expected $cases passing cases"
[ "$(grep -c "^control" "$W/log")" -eq 3 ] || fail "expected 3 negative controls"
echo PASS
