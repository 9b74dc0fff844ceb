#!/usr/bin/env bash
# The best checkpoint (--save-best-by, docs/checkpoints.md "The best checkpoint"): evaluations
# every 2 steps, saves every 4, --keep-last 1. best.json names the best evaluation (its step,
# value and checkpoint, saved at that step when no save fell there) and <output-dir>/best and
# <output-dir>/latest point at the right directories; --keep-last keeps the newest and the best.
# A resumed run with a ruinous learning rate reads the best back and never replaces it by its
# worse evaluations. Two ranks agree on a new best. A name no evaluation logs is a usage error at
# start-up; the YAML key works.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/best_checkpoint"; rm -rf "$W"; mkdir -p "$W"
OUT="$W/run"
run_args() {
  echo "$(train_args "$DATA" "$1") --eval-hidden-states-path $DATA/eval_hidden_states" \
       "--draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 --log-steps 2" \
       "--save-interval 0 --save-steps 4 --eval-steps 2 --eval-interval 0 --keep-last 1"
}

# check_best METRIC OUT LATEST_STEP: best.json is the first best of every evaluation logged, its
# checkpoint is complete and linked as best; latest links LATEST_STEP; the checkpoints left are
# the newest and the best.
check_best() {
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, os, sys
metric, out, latest_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
evals = [(r["step"], r[metric]) for r in map(json.loads, open(f"{out}/metrics.jsonl")) if metric in r]
assert len(evals) >= 2, evals
minimise = "loss" in metric
best_step, best_value = evals[0]
for step, v in evals[1:]:  # strictly better only: a tie keeps the earlier
    if (v < best_value) if minimise else (v > best_value):
        best_step, best_value = step, v
rec = json.load(open(f"{out}/best.json"))
print("evaluations:", ", ".join(f"{s}:{v:.4f}" for s, v in evals), "| best.json:", rec)
assert rec["metric"] == metric and rec["direction"] == ("min" if minimise else "max"), rec
assert rec["step"] == best_step and abs(rec["value"] - best_value) <= 1e-12 * max(1, abs(best_value)), (rec, best_step, best_value)
assert rec["checkpoint"] == f"epoch_0_step_{best_step}", rec
assert os.path.islink(f"{out}/best") and os.readlink(f"{out}/best") == rec["checkpoint"], os.readlink(f"{out}/best")
assert os.path.isfile(f"{out}/best/COMPLETE") and os.path.isfile(f"{out}/best/model.safetensors")
assert os.path.islink(f"{out}/latest") and os.readlink(f"{out}/latest") == f"epoch_0_step_{latest_step}", os.readlink(f"{out}/latest")
ckpts = sorted(d for d in os.listdir(out) if d.startswith("epoch_"))
want = sorted({f"epoch_0_step_{latest_step}", rec["checkpoint"]})
assert ckpts == want, (ckpts, want)
print(f"best {metric} {best_value:.4f} at step {best_step}; checkpoints kept: {ckpts}")
PYEOF
}

# 8 steps: evaluations at 2, 4, 6, 8; saves at 4 and 8, and at the first best's step.
run_np 1 $(run_args "$OUT") --max-steps 8 >"$W/first.log" 2>&1 || { cat "$W/first.log"; fail "first run"; }
grep -q "new best eval/accept_len" "$W/first.log" || { cat "$W/first.log"; fail "no new best logged"; }
# The first evaluation is a best at a step without a save: its checkpoint is saved then.
grep -q "saved checkpoint $OUT/epoch_0_step_2 " "$W/first.log" || { grep "saved checkpoint" "$W/first.log"; fail "the best of step 2 was not saved"; }
check_best eval/accept_len "$OUT" 8 || fail "best after the first run"
cp "$OUT/best.json" "$W/best_before.json"

# Resumed with a learning rate that ruins the draft: later evaluations are worse, the best stays.
run_np 1 $(run_args "$OUT") --max-steps 14 --resume auto --learning-rate 0.5 >"$W/resumed.log" 2>&1 || { cat "$W/resumed.log"; fail "resumed run"; }
grep -q "the best so far is epoch_0_step_" "$W/resumed.log" || { cat "$W/resumed.log"; fail "the resumed run did not read best.json"; }
grep -q "resumed from $OUT/epoch_0_step_8 " "$W/resumed.log" || { grep resumed "$W/resumed.log"; fail "resume did not take the newest checkpoint"; }
check_best eval/accept_len "$OUT" 14 || fail "best after the resumed run"
"$PY" - "$OUT/metrics.jsonl" "$W/best_before.json" "$OUT/best.json" <<'PYEOF' || fail "the resumed run's evaluations were not worse: the test proves nothing"
import json, sys
before, after = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
later = [r["eval/accept_len"] for r in map(json.loads, open(sys.argv[1])) if "eval/accept_len" in r and r["step"] > 8]
assert before == after, (before, after)
assert later and max(later) < before["value"], (later, before)
print(f"resumed evaluations {later} all below the best {before['value']:.4f}: best.json unchanged")
PYEOF

# 2 ranks: the ranks agree on a new best and save it together.
run_np 2 $(run_args "$W/np2") --max-steps 4 >"$W/np2.log" 2>&1 || { cat "$W/np2.log"; fail "2-rank run"; }
check_best eval/accept_len "$W/np2" 4 || fail "best at 2 ranks"

# Another metric from the YAML file (loss: minimised), and none.
printf 'save_best_by: eval/loss\n' >"$W/loss.yaml"
run_np 1 --config "$W/loss.yaml" $(run_args "$W/loss") --max-steps 6 >"$W/loss.log" 2>&1 || { cat "$W/loss.log"; fail "run by eval/loss"; }
check_best eval/loss "$W/loss" 6 || fail "best by eval/loss"
run_np 1 $(run_args "$W/none") --max-steps 2 --save-best-by none >"$W/none.log" 2>&1 || { cat "$W/none.log"; fail "run with --save-best-by none"; }
[ ! -e "$W/none/best.json" ] && [ ! -L "$W/none/best" ] || fail "--save-best-by none kept a best"
[ "$(readlink "$W/none/latest")" = epoch_0_step_2 ] || fail "no latest link with --save-best-by none"

# A metric no evaluation logs: exit 2 at start-up, naming the flag.
expect_usage_error "--save-best-by eval/acc_3" run_np 1 $(run_args "$W/bad") --save-best-by eval/acc_3
grep -q -- "--save-best-by eval/acc_3" <<<"$out" || fail "the error does not name the flag: $out"
printf 'save_best_by: train/loss\n' >"$W/bad.yaml"
expect_usage_error "save_best_by: train/loss" run_np 1 --config "$W/bad.yaml" $(run_args "$W/bad2")
echo "best_checkpoint: ok"
