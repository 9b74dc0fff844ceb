#!/usr/bin/env bash
# The launcher's supervision: with --max-restarts, a job that loses a rank (SIGKILL, as the OOM
# killer or a dying node would) starts again and resumes from the newest checkpoint of its own
# launch, ending bitwise equal to a run that never failed; restarts stop when they are used up,
# and a usage error (exit 2) is never restarted. A stop signal to the launcher stops every rank cleanly: checkpoint, exit 0.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/restart"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --num-epochs 1 --draft-global-batch-size 4 \
  --draft-micro-batch-size 2 --save-interval 0 --save-steps 2"
args() { echo "$(train_args "$DATA" "$1") $COMMON"; }

# Flags: --max-restarts belongs to the launcher.
expect_usage_error "--max-restarts alone" "$BIN" --max-restarts 2 $(args "$W/x")
grep -q -- "--nproc-per-node" <<<"$out" || fail "--max-restarts alone: $out"
expect_usage_error "--max-restarts -1" "$BIN" --nproc-per-node 2 --max-restarts -1 comm-bench
grep -q -- "--max-restarts" <<<"$out" || fail "--max-restarts -1: $out"

# The reference: 2 ranks, 6 steps, never interrupted.
run_np 2 $(args "$W/straight") --max-steps 6 >"$W/straight.log" 2>&1 || { cat "$W/straight.log"; fail "reference run"; }

# An earlier launch saved steps 2 and 4 of the same run; this launch goes back to step 2
# (--resume PATH): step 4 of the abandoned branch is set aside at the start, this launch saves
# its own step 4, rank 1 is killed after step 5, and the restart takes this launch's step 4.
run_np 2 $(args "$W/restart") --max-steps 4 >"$W/first.log" 2>&1 || { cat "$W/first.log"; fail "earlier launch"; }
FSDP_TEST_KILL_AT_STEP=5 FSDP_TEST_KILL_RANK=1 "$BIN" --nproc-per-node 2 --max-restarts 2 \
  $(args "$W/restart") --resume "$W/restart/epoch_0_step_2" --max-steps 6 >"$W/restart.log" 2>&1; r=$?
[ $r -eq 0 ] || { cat "$W/restart.log"; fail "restarted job exited $r"; }
for want in "set aside as $W/restart/epoch_0_step_4.superseded" \
            "the job failed (exit code 137); restart 1 of 2 in 5 s" \
            "restart 1 of launch" "resuming from $W/restart/epoch_0_step_4" \
            "resumed from $W/restart/epoch_0_step_4 at step 4"; do
  grep -qF -- "$want" "$W/restart.log" || { cat "$W/restart.log"; fail "no '$want'"; }
done
grep -q "restart 2 of" "$W/restart.log" && fail "restarted twice"
compare_exports "$(latest_ckpt "$W/straight")" "$(latest_ckpt "$W/restart")" 0 || fail "the restarted run differs"
"$PY" - "$W/restart/epoch_0_step_6/trainer_state.json" "$W/restart/epoch_0_step_4/trainer_state.json" \
  "$W/restart/epoch_0_step_4.superseded/trainer_state.json" <<'PYEOF' || fail "launch ids"
import json, sys
a, b, c = (json.load(open(p)).get("launch_id") for p in sys.argv[1:])
assert a and a == b and c != a, (a, b, c)
print("both attempts' checkpoints carry launch", a, "(the earlier launch:", c, ")")
PYEOF
# metrics.jsonl holds one timeline: each step once (what the failed attempt logged after its
# checkpoint moved to metrics.superseded.jsonl).
"$PY" - "$W/restart/metrics.jsonl" <<'PYEOF' || fail "metrics.jsonl after the restart"
import json, sys
steps = [r["step"] for r in map(json.loads, open(sys.argv[1])) if "train/ploss_0" in r]
assert steps == [1, 2, 3, 4, 5, 6], steps  # (3 and 4 of the earlier launch, 5 of attempt 0: moved aside)
print("metrics.jsonl steps", steps)
PYEOF

# Killed on every attempt: the restarts run out and the job's exit code is returned.
FSDP_TEST_KILL_AT_STEP=3 FSDP_TEST_KILL_ATTEMPTS=9 "$BIN" --nproc-per-node 1 --max-restarts 1 \
  $(args "$W/exhausted") --max-steps 6 >"$W/exhausted.log" 2>&1; r=$?
[ $r -ne 0 ] || { cat "$W/exhausted.log"; fail "a job that always fails exited 0"; }
grep -qF "1 restart(s) of --max-restarts" "$W/exhausted.log" || { cat "$W/exhausted.log"; fail "no used-up message"; }
[ "$(grep -c "resumed from $W/exhausted/epoch_0_step_2" "$W/exhausted.log")" -eq 1 ] || fail "the restart did not resume from step 2"

# Killed before this launch's first save: the restart starts as the first attempt did, and
# metrics.jsonl still holds each step once (the crashed attempt's records move aside).
FSDP_TEST_KILL_AT_STEP=1 "$BIN" --nproc-per-node 1 --max-restarts 1 $(args "$W/early") --max-steps 4 \
  >"$W/early.log" 2>&1 || { cat "$W/early.log"; fail "restart before the first save"; }
grep -q "no checkpoint of this launch yet" "$W/early.log" || { cat "$W/early.log"; fail "no fresh restart"; }
"$PY" - "$W/early/metrics.jsonl" <<'PYEOF' || fail "metrics.jsonl after a restart before the first save"
import json, sys
steps = [r["step"] for r in map(json.loads, open(sys.argv[1])) if "train/ploss_0" in r]
assert steps == [1, 2, 3, 4], steps
PYEOF

# A usage error is not restarted.
expect_usage_error "usage error under --max-restarts" "$BIN" --nproc-per-node 1 --max-restarts 3 $(args "$W/usage") --learning-rate -1
grep -q "not restarted" <<<"$out" && ! grep -q "restart 1 of" <<<"$out" || { echo "$out"; fail "usage error restarted"; }

# SIGTERM to the launcher: every rank saves and exits 0 (mpirun alone would kill them); no restart.
"$BIN" --nproc-per-node 2 --max-restarts 2 $(args "$W/sig") --num-epochs 200 --total-steps 4000 \
  --save-steps 0 --save-final false >"$W/sig.log" 2>&1 &
signal_after_lines $! "$W/sig" 3 TERM; r=$?
[ $r -eq 0 ] || { cat "$W/sig.log"; fail "SIGTERM to the launcher: exit $r"; }
grep -q "stop requested (signal 10)" "$W/sig.log" || { cat "$W/sig.log"; fail "the ranks did not stop cleanly"; }
[ -f "$(latest_ckpt "$W/sig")/COMPLETE" ] || fail "no checkpoint after SIGTERM"
grep -q "restart 1 of" "$W/sig.log" && fail "restarted after a stop signal"
# SIGUSR1 (a scheduler's preemption warning) to the launcher: the same clean stop.
"$BIN" --nproc-per-node 1 --max-restarts 2 $(args "$W/usr1") --num-epochs 200 --total-steps 4000 \
  --save-steps 0 --save-final false >"$W/usr1.log" 2>&1 &
signal_after_lines $! "$W/usr1" 2 USR1; r=$?
[ $r -eq 0 ] && grep -q "stop requested (signal 10)" "$W/usr1.log" || { cat "$W/usr1.log"; fail "SIGUSR1 to the launcher: exit $r"; }
echo PASS
