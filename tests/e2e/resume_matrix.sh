#!/usr/bin/env bash
# Resumption across the features that keep state of their own, at 2 ranks: --packing,
# --sp-ulysses-size 2, LoRA (--lora-rank over --init-checkpoint), --noise-std, another
# divergence (--loss-fn jsd) and an LK objective (--lk-loss-type alpha). For each, a run is
# SIGKILLed mid-way (rank 1 kills itself after step KILL_AT, one step past the checkpoint of
# step SAVE_AT: the test hook FSDP_TEST_KILL_AT_STEP, so the kill point is exact, no timing), then
# `--resume auto` continues it to STEPS; its final weights are bitwise the uninterrupted run's,
# and so is every per-step loss, accuracy and gradient norm logged after the checkpoint.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/resume_matrix"; rm -rf "$W"; mkdir -p "$W"
SAVE_AT=2 KILL_AT=3 STEPS=5
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2
  --save-interval 0 --save-steps $SAVE_AT --num-epochs 1 --max-steps $STEPS"
t0=$SECONDS

# The toy draft with 8 attention heads over 4 key/value heads: Ulysses splits heads by 2.
"$PY" - "$DATA/draft_config.json" "$W/draft_gqa.json" <<'PYEOF' || fail "writing the GQA draft config"
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PYEOF
# A base draft for LoRA to adapt.
"$BIN" $(train_args "$DATA" "$W/base") $COMMON --save-steps 0 --max-steps 2 >"$W/base.log" 2>&1 ||
  { tail -20 "$W/base.log"; fail "base draft for LoRA"; }
BASE="$(latest_ckpt "$W/base")"

# same_metrics A B FROM: every per-step train/ value (losses, accuracies, acceptance, gradient
# norm, learning rate) logged at steps >= FROM is equal in A and B.
same_metrics() {
  "$PY" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" <<'PYEOF'
import json, sys
def steps(path):
    rows = {}
    for r in map(json.loads, open(path)):
        if "train/loss" in r and r["step"] >= int(sys.argv[3]):
            rows[r["step"]] = {k: v for k, v in r.items() if k.startswith("train/")}
    return rows
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
n = 0
for s in a:
    assert a[s].keys() == b[s].keys(), (s, sorted(a[s].keys() ^ b[s].keys()))
    for k, v in a[s].items():
        assert v == b[s][k], (s, k, v, b[s][k])
        n += 1
print(f"{n} per-step values of steps {min(a)}-{max(a)} bitwise equal")
PYEOF
}

# case NAME ARGS...: uninterrupted vs killed after step KILL_AT and resumed, at 2 ranks.
case_() {
  local name="$1" rc; shift
  local d="$W/$name"
  run_np 2 $(train_args "$DATA" "$d/straight") $COMMON "$@" >"$d.straight.log" 2>&1 ||
    { tail -20 "$d.straight.log"; fail "$name: uninterrupted run"; }
  FSDP_TEST_KILL_AT_STEP=$KILL_AT FSDP_TEST_KILL_RANK=1 run_np 2 $(train_args "$DATA" "$d/part") $COMMON "$@" \
    >"$d.killed.log" 2>&1; rc=$?
  [ $rc -ne 0 ] || { tail -20 "$d.killed.log"; fail "$name: the run to be killed exited 0"; }
  [ -f "$d/part/epoch_0_step_$SAVE_AT/COMPLETE" ] || fail "$name: no complete checkpoint of step $SAVE_AT: $(ls "$d/part")"
  [ "$(latest_ckpt "$d/part")" = "$d/part/epoch_0_step_$SAVE_AT" ] ||
    fail "$name: a checkpoint past step $SAVE_AT: $(ls "$d/part")"
  run_np 2 $(train_args "$DATA" "$d/part") $COMMON "$@" --resume auto >"$d.resumed.log" 2>&1 ||
    { tail -20 "$d.resumed.log"; fail "$name: resumed run"; }
  grep -q "resumed from .*epoch_0_step_$SAVE_AT" "$d.resumed.log" || { tail -20 "$d.resumed.log"; fail "$name: did not resume from step $SAVE_AT"; }
  compare_exports "$(latest_ckpt "$d/straight")" "$(latest_ckpt "$d/part")" 0 || fail "$name: weights after the resume differ"
  same_metrics "$d/straight" "$d/part" $((SAVE_AT + 1)) || fail "$name: per-step metrics after the resume differ"
  echo "$name: killed after step $KILL_AT (exit $rc), resumed from step $SAVE_AT, bitwise equal ($((SECONDS - t0)) s so far)"
}

case_ packing --packing
case_ seq_parallel --sp-ulysses-size 2 --draft-micro-batch-size 1 --draft-model-config "$W/draft_gqa.json"
case_ lora --init-checkpoint "$BASE" --lora-rank 4 --lora-alpha 8
case_ noise --noise-std 0.05
case_ loss_jsd --loss-fn jsd
case_ lk_alpha --lk-loss-type alpha
echo "PASS ($((SECONDS - t0)) s)"
