#!/usr/bin/env bash
# --optimizer muon end to end on the toy EAGLE3 features (docs/usage.md "Optimizers"): the loss
# falls; 1 and 2 ranks train the same per-step losses (within 1e-2: the bf16 Newton-Schulz
# rounds the ranks' other summation order); a run stopped at step 12 and resumed (its momentum in
# the checkpoint) ends bitwise equal to an
# uninterrupted one; an AdamW checkpoint resumed with --optimizer muon, and a Muon knob without
# --optimizer muon, are refused by name.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/muon_train"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --num-epochs 1"
STEPS=24

for np in 1 2; do
  run_np $np $(train_args "$DATA" "$W/np$np") $COMMON --max-steps $STEPS --optimizer muon \
    >"$W/np$np.log" 2>&1 || { tail -30 "$W/np$np.log"; fail "Muon training at $np rank(s)"; }
done
# The weights are compared through what they compute: 2 ranks sum the gradient in another
# order, and the bf16 Newton-Schulz rounds such a difference to the next bf16 value (2^-8 of the
# update) now and then, which moves weights by up to a few percent in directions the loss does
# not see. With equal gradients the sharded step is bitwise the whole-matrix one (mpi.shard's
# Muon tests). The loss falls (the mean of the last 6 steps below the first 6's).
"$PY" - "$W/np1/metrics.jsonl" "$W/np2/metrics.jsonl" <<'PYEOF' || fail "the loss under Muon"
import json, sys
a, b = ([r["train/loss"] for r in map(json.loads, open(p)) if "train/loss" in r] for p in sys.argv[1:3])
assert len(a) == len(b) == 24, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst < 1e-2, ("1 vs 2 ranks", worst)
assert sum(a[-6:]) < sum(a[:6]), a
print(f"Muon: loss {sum(a[:6]) / 6:.3f} -> {sum(a[-6:]) / 6:.3f} (means of 6 steps); 1 vs 2 ranks "
      f"per-step losses within {worst:.1e}")
PYEOF

# Stopped at step 12, resumed to 24: bitwise the uninterrupted 2-rank run.
run_np 2 $(train_args "$DATA" "$W/part") $COMMON --max-steps 12 --optimizer muon >"$W/part1.log" 2>&1 ||
  { tail -30 "$W/part1.log"; fail "first half"; }
run_np 2 $(train_args "$DATA" "$W/part") $COMMON --max-steps $STEPS --optimizer muon --resume \
  >"$W/part2.log" 2>&1 || { tail -30 "$W/part2.log"; fail "resumed half"; }
grep -q "resumed from .*step_12" "$W/part2.log" || fail "did not resume from step 12"
compare_exports "$(latest_ckpt "$W/np2")" "$(latest_ckpt "$W/part")" 0 || fail "resume is not bitwise exact"

# An AdamW checkpoint resumed with Muon: refused, naming the optimizer.
run_np 1 $(train_args "$DATA" "$W/adamw") $COMMON --max-steps 2 >"$W/adamw.log" 2>&1 ||
  { tail -30 "$W/adamw.log"; fail "AdamW run"; }
expect_usage_error "AdamW state with --optimizer muon" "$BIN" $(train_args "$DATA" "$W/adamw") \
  $COMMON --max-steps 4 --optimizer muon --resume
grep -q -- "--optimizer" <<<"$out" || { echo "$out" | tail -5; fail "the mismatch does not name --optimizer"; }
expect_usage_error "a Muon knob without Muon" "$BIN" $(train_args "$DATA" "$W/bad") $COMMON \
  --max-steps 1 --muon-momentum 0.9
grep -q -- "--muon-momentum" <<<"$out" || { echo "$out" | tail -5; fail "the knob is not named"; }
echo PASS
