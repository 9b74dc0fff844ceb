#!/usr/bin/env bash
# Exact resume: a run stopped at step K (by --max-steps, and once by SIGTERM) and resumed ends
# bitwise identical to an uninterrupted run on the same number of ranks; resuming on a
# different number of ranks reshards and agrees within tolerance.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/train_resume"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0"

# 2 ranks: 30 steps straight vs 14 + resume to 30 (crosses the epoch boundary at 24).
run_np 2 $(train_args "$DATA" "$W/full") $COMMON --num-epochs 2 --max-steps 30 >"$W/full.log" 2>&1 ||
  { cat "$W/full.log"; fail "full run"; }
run_np 2 $(train_args "$DATA" "$W/part") $COMMON --num-epochs 2 --max-steps 14 >"$W/part1.log" 2>&1 ||
  { cat "$W/part1.log"; fail "first half"; }
[ -d "$W/part/epoch_0_step_14" ] || fail "no checkpoint at step 14: $(ls "$W/part")"
cp -r "$W/part" "$W/part_np1"
run_np 2 $(train_args "$DATA" "$W/part") $COMMON --num-epochs 2 --max-steps 30 --resume >"$W/part2.log" 2>&1 ||
  { cat "$W/part2.log"; fail "resumed half"; }
grep -q "resumed from .*epoch_0_step_14" "$W/part2.log" || fail "did not resume from step 14"
compare_exports "$(latest_ckpt "$W/full")" "$(latest_ckpt "$W/part")" 0 || fail "resume is not bitwise exact"
# The epoch summary of the epoch resumed in the middle equals the uninterrupted run's (the
# checkpoint carries the epoch's metric sums so far).
"$PY" - "$W/full/metrics.jsonl" "$W/part/metrics.jsonl" <<'PYEOF' || fail "epoch metrics differ after a resume"
import json, sys
def epoch0(path):
    rows = [r for r in map(json.loads, open(path)) if "train_epoch/ploss_0" in r]
    return {k: v for k, v in rows[0].items() if k.startswith("train_epoch/")}
a, b = epoch0(sys.argv[1]), epoch0(sys.argv[2])
assert a.keys() == b.keys() and a, (a, b)
for k in a:
    assert abs(a[k] - b[k]) <= 1e-12 * max(1.0, abs(a[k])), (k, a[k], b[k])
print("epoch 0 summary identical after the resume at step 14:", len(a), "values")
PYEOF

# The step-14 state resumed on 1 rank (resharded) continues to the same weights within tolerance.
run_np 1 $(train_args "$DATA" "$W/part_np1") $COMMON --num-epochs 2 --max-steps 30 --resume auto \
  >"$W/np1.log" 2>&1 || { cat "$W/np1.log"; fail "resume on 1 rank"; }
compare_exports "$(latest_ckpt "$W/full")" "$(latest_ckpt "$W/part_np1")" 1e-4 || fail "resharded resume"
# A resume with more epochs keeps the checkpoint's schedule (48 steps) and says how to extend it.
"$BIN" $(train_args "$DATA" "$W/part_np1") $COMMON --num-epochs 3 --max-steps 30 --resume \
  --learning-rate 2e-3 >"$W/epochs.log" 2>&1 || { cat "$W/epochs.log"; fail "resume with --num-epochs 3"; }
grep -qF "learning_rate 0.001 -> 0.002" \
  "$W/epochs.log" || { cat "$W/epochs.log"; fail "no warning for a changed learning rate"; }
grep -qE -- "--num-epochs 3 .*step 72.* 48" \
  "$W/epochs.log" && grep -q "pass --total-steps 72" "$W/epochs.log" ||
  { cat "$W/epochs.log"; fail "no warning for a resume with another --num-epochs"; }

# --save-final false: the end of training writes nothing (and says so).
"$BIN" $(train_args "$DATA" "$W/nofinal") $COMMON --num-epochs 1 --max-steps 2 --save-final false \
  >"$W/nofinal.log" 2>&1 || { cat "$W/nofinal.log"; fail "--save-final false run"; }
grep -q "^epoch_" <<<"$(ls "$W/nofinal")" && fail "--save-final false wrote $(ls "$W/nofinal")"
grep -q "weights of step 2 are not saved" "$W/nofinal.log" || fail "no --save-final false warning"

# SIGTERM: the run finishes its step, saves (even with --save-final false) and exits 0;
# resuming reaches the same weights as a run that was never interrupted.
LONG="--num-epochs 200 --total-steps 4000"
"$BIN" $(train_args "$DATA" "$W/sig") $COMMON $LONG --save-final false >"$W/sig.log" 2>&1 &
pid=$!
# Meanwhile a second run in the same --output-dir is refused (it would overwrite the first's
# checkpoints); the first holds the directory's lock.
wait_for_lines "$W/sig" 5
expect_usage_error "a second run in a used --output-dir" "$BIN" $(train_args "$DATA" "$W/sig") $COMMON $LONG --resume
grep -qF "(pid $pid on host" <<<"$out" || { echo "$out"; fail "a second run in a used --output-dir: no lock holder named"; }
kill -TERM $pid
wait $pid; rc=$?
[ $rc -eq 0 ] || { cat "$W/sig.log"; fail "SIGTERM run exited $rc"; }
grep -q "stop requested" "$W/sig.log" || fail "no stop message"
CK="$(latest_ckpt "$W/sig")"
[ -f "$CK/COMPLETE" ] || fail "no complete checkpoint after SIGTERM"
K=$(basename "$CK" | sed 's/.*_step_//')
TARGET=$((K + 5))
echo "SIGTERM checkpoint at step $K; resuming to $TARGET"
run_np 1 $(train_args "$DATA" "$W/sig") $COMMON $LONG --max-steps $TARGET --resume >"$W/sig2.log" 2>&1 ||
  { cat "$W/sig2.log"; fail "resume after SIGTERM"; }
run_np 1 $(train_args "$DATA" "$W/straight") $COMMON $LONG --max-steps $TARGET >"$W/straight.log" 2>&1 ||
  { cat "$W/straight.log"; fail "uninterrupted run"; }
compare_exports "$(latest_ckpt "$W/straight")" "$(latest_ckpt "$W/sig")" 0 || fail "SIGTERM resume not exact"
grep -q "^.tmp_" <<<"$(ls -a "$W/sig")" && fail "a temporary checkpoint directory was left behind"
# An output directory with checkpoints is never overwritten by a fresh run (exit 2, nothing
# written); a resume uses the checkpoint's vocabulary mapping even when the mapping computed
# now would differ (--max-length 16 counts other tokens); a draft config of another shape is
# refused naming the key.
expect_usage_error "a fresh run in a used --output-dir" "$BIN" $(train_args "$DATA" "$W/full") $COMMON --num-epochs 2 --max-steps 2
grep -q "already holds checkpoints" <<<"$out" || { echo "$out"; fail "a fresh run in a used --output-dir"; }
cp -r "$W/full" "$W/vm"
# Continuing another directory's checkpoint into an --output-dir with a run of its own: refused.
expect_usage_error "--resume PATH outside a used --output-dir" "$BIN" $(train_args "$DATA" "$W/vm") $COMMON --num-epochs 2 \
  --max-steps 31 --resume "$W/part/epoch_1_step_30"
grep -q "is outside --output-dir" <<<"$out" || { echo "$out"; fail "--resume PATH outside a used --output-dir"; }
"$BIN" $(train_args "$DATA" "$W/vm") $COMMON --num-epochs 2 --max-steps 31 --resume --max-length 16 \
  --cache-dir "$W/vm_cache" >"$W/vm.log" 2>&1 || { cat "$W/vm.log"; fail "resume with another --max-length"; }
grep -q "vocab mapping: .*$W/vm/epoch_1_step_30" "$W/vm.log" || { cat "$W/vm.log"; fail "the mapping was not taken from the checkpoint"; }
"$PY" - "$W/vm/epoch_1_step_30/model.safetensors" "$W/vm/epoch_1_step_31/model.safetensors" <<'PYEOF' || fail "the resumed run changed the vocabulary mapping"
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert (a["d2t"] == b["d2t"]).all() and (a["t2d"] == b["t2d"]).all()
print("d2t/t2d kept across the resume")
PYEOF
sed 's/"intermediate_size": [0-9]*/"intermediate_size": 256/' "$DATA/draft_config.json" >"$W/wide.json"
expect_usage_error "another draft shape on resume" "$BIN" $(train_args "$DATA" "$W/vm") $COMMON --num-epochs 2 --max-steps 32 \
  --resume --draft-model-config "$W/wide.json"
grep -q "differ in intermediate_size" <<<"$out" || { echo "$out"; fail "another draft shape on resume"; }

# W&B (offline): a resumed run continues the same W&B run (its id is kept in the checkpoint).
# launch/setup.sh installs wandb: a venv without it is a broken setup, so the test fails.
"$PY" -c "import wandb" 2>/dev/null ||
  fail "package wandb is not installed in the venv of $PY (launch/setup.sh installs it)"
WB="--report-to wandb --wandb-project fsdp-e2e"
for steps in 2 4; do
  WANDB_MODE=offline WANDB_SILENT=true FSDP_PYTHON="$PY" "$BIN" $(train_args "$DATA" "$W/wb") $COMMON \
    --num-epochs 1 --max-steps $steps --resume $WB >"$W/wb$steps.log" 2>&1 || { cat "$W/wb$steps.log"; fail "W&B run to step $steps"; }
done
"$PY" - "$W/wb" <<'PYEOF' || fail "the resumed run did not continue its W&B run"
import glob, json, sys
ids = [json.load(open(f"{sys.argv[1]}/epoch_0_step_{s}/trainer_state.json")).get("wandb_run_id") for s in (2, 4)]
assert ids[0] and ids[0] == ids[1], ids
runs = sorted(glob.glob(f"{sys.argv[1]}/wandb/offline-run-*"))
assert len(runs) == 2 and all(r.split("-run-")[1].split("-")[1] == ids[0] for r in runs), runs
print("both parts logged to W&B run", ids[0])
PYEOF
echo PASS
