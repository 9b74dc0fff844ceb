#!/usr/bin/env bash
# The per-phase time breakdown of the logged steps (docs/usage.md "Time breakdown"): every
# logging step carries perf/<phase>_share and perf/<phase>_s for data, forward, backward, comm
# (exposed communication), optimizer and other; the shares sum to 1 and the seconds to the step
# time; with 2 ranks some communication is exposed; the console line shows the shares.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/time_breakdown"; rm -rf "$W"; mkdir -p "$W"
for np in 1 2; do
  run_np $np $(train_args "$DATA" "$W/np$np") --draft-global-batch-size 4 --max-steps 6 \
    --log-steps 2 --save-interval 0 --save-final false >"$W/np$np.log" 2>&1 \
    || { tail -20 "$W/np$np.log"; fail "training at $np rank(s)"; }
  "$PY" - "$W/np$np/metrics.jsonl" "$np" <<'PYEOF' || fail "breakdown at $np rank(s)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "perf/forward_share" in r]
assert len(rows) == 3, len(rows)
phases = ["data", "forward", "backward", "comm", "optimizer", "other"]
comm = 0.0
for r in rows:
    shares = [r.get(f"perf/{p}_share", 0.0) for p in phases]
    assert all(0.0 <= s <= 1.0 for s in shares), shares
    assert abs(sum(shares) - 1.0) < 1e-9, shares
    secs = sum(r.get(f"perf/{p}_s", 0.0) for p in phases)
    assert abs(secs - r["perf/step_time_s"]) <= 1e-6 * max(1.0, secs), (secs, r["perf/step_time_s"])
    assert r["perf/forward_s"] > 0 and r["perf/backward_s"] > 0 and r["perf/optimizer_s"] > 0, r
    comm += r["perf/comm_s"]
if sys.argv[2] == "2":
    assert comm > 0, "no exposed communication at 2 ranks"
PYEOF
done
grep -q "| fwd [0-9]*% bwd [0-9]*% comm [0-9]*% opt [0-9]*%" "$W/np2.log" || { tail -5 "$W/np2.log"; fail "no breakdown on the console line"; }
echo PASS
