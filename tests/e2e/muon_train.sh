#!/usr/bin/env bash
# --optimizer muon end to end on the toy EAGLE3 features (docs/usage.md "Optimizers"): the loss
# falls; 1 and 2 ranks train the same per-step losses (within 1e-2: the bf16 Newton-Schulz
# rounds the ranks' other summation order); --cpu-offload trains what the device path does; a run
# SIGKILLed after step 13 and resumed from its step-12 checkpoint (momentum included) ends bitwise
# equal to an uninterrupted one, and the same checkpoint resumed on 1 rank trains the remaining
# steps' losses within 1e-2; LoRA adapters train under Muon; an AdamW checkpoint resumed with
# --optimizer muon is refused by name unless --reset-optimizer-state starts Muon's state fresh;
# a Muon knob without --optimizer muon, and --muon-lr beside --muon-lr-ratio, are refused by name.
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

# --cpu-offload: the same step on host-resident state.
run_np 2 $(train_args "$DATA" "$W/offload") $COMMON --max-steps $STEPS --optimizer muon \
  --cpu-offload >"$W/offload.log" 2>&1 || { tail -30 "$W/offload.log"; fail "Muon with --cpu-offload"; }
compare_exports "$(latest_ckpt "$W/np2")" "$(latest_ckpt "$W/offload")" 1e-6 || fail "--cpu-offload"

# SIGKILLed after step 13 (rank 1 kills itself: the test hook, no timing), one step past the
# checkpoint of step 12, resumed to 24: bitwise the uninterrupted 2-rank run.
FSDP_TEST_KILL_AT_STEP=13 FSDP_TEST_KILL_RANK=1 run_np 2 $(train_args "$DATA" "$W/part") $COMMON \
  --max-steps $STEPS --save-steps 12 --optimizer muon >"$W/part1.log" 2>&1 &&
  { tail -20 "$W/part1.log"; fail "the run to be killed exited 0"; }
ck12="$(latest_ckpt "$W/part")"
case "$ck12" in *step_12) ;; *) fail "no checkpoint of step 12 alone: $(ls "$W/part")" ;; esac
mkdir -p "$W/other" && cp -r "$ck12" "$W/other/"
run_np 2 $(train_args "$DATA" "$W/part") $COMMON --max-steps $STEPS --save-steps 12 \
  --optimizer muon --resume auto >"$W/part2.log" 2>&1 || { tail -30 "$W/part2.log"; fail "resumed half"; }
grep -q "resumed from .*step_12" "$W/part2.log" || fail "did not resume from step 12"
compare_exports "$(latest_ckpt "$W/np2")" "$(latest_ckpt "$W/part")" 0 || fail "resume is not bitwise exact"
# The step-12 state (2 ranks) resumed on 1 rank: resharded momentum, the same later losses.
run_np 1 $(train_args "$DATA" "$W/other") $COMMON --max-steps $STEPS --optimizer muon --resume auto \
  >"$W/other.log" 2>&1 || { tail -30 "$W/other.log"; fail "resumed on 1 rank"; }
grep -q "resumed from .*step_12" "$W/other.log" || fail "1 rank did not resume from step 12"
"$PY" - "$W/np2/metrics.jsonl" "$W/other/metrics.jsonl" <<'PYEOF' || fail "resume on another rank count"
import json, sys
a, b = ({r["step"]: r["train/loss"] for r in map(json.loads, open(p)) if "train/loss" in r}
        for p in sys.argv[1:3])
later = [s for s in b if s > 12]
assert len(later) == 12, sorted(b)
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in later)
assert worst < 1e-2, worst
print(f"resumed on 1 rank from 2: steps 13-24 within {worst:.1e} of the 2-rank run")
PYEOF

# LoRA adapters of a trained draft (--init-checkpoint): Muon on their A and B matrices.
run_np 2 $(train_args "$DATA" "$W/lora") $COMMON --max-steps 6 --optimizer muon --lora-rank 4 \
  --init-checkpoint "$(latest_ckpt "$W/np1")" >"$W/lora.log" 2>&1 ||
  { tail -30 "$W/lora.log"; fail "LoRA under Muon"; }
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/lora")" 0 >/dev/null 2>&1 &&
  fail "the LoRA run under Muon left the merged draft unchanged"

# An AdamW checkpoint resumed with Muon: refused, naming the optimizer.
run_np 1 $(train_args "$DATA" "$W/adamw") $COMMON --max-steps 2 >"$W/adamw.log" 2>&1 ||
  { tail -30 "$W/adamw.log"; fail "AdamW run"; }
expect_usage_error "AdamW state with --optimizer muon" "$BIN" $(train_args "$DATA" "$W/adamw") \
  $COMMON --max-steps 4 --optimizer muon --resume
grep -q -- "--optimizer" <<<"$out" || { echo "$out" | tail -5; fail "the mismatch does not name --optimizer"; }
grep -q -- "--reset-optimizer-state" <<<"$out" || { echo "$out" | tail -5; fail "the mismatch does not name the way out"; }
# ... and taken over with --reset-optimizer-state: the weights and step resumed, Muon's state
# fresh, AdamW's bias correction counted from step 2 (the manifest says so).
run_np 1 $(train_args "$DATA" "$W/adamw") $COMMON --max-steps 4 --optimizer muon --resume \
  --reset-optimizer-state >"$W/switch.log" 2>&1 || { tail -30 "$W/switch.log"; fail "AdamW -> Muon"; }
grep -q "resumed from .*step_2" "$W/switch.log" || fail "the switch did not resume from step 2"
m="$(latest_ckpt "$W/adamw")/train_state/manifest.txt"
grep -qx "optimizer muon" "$m" && grep -qx "optimizer_since 2" "$m" ||
  { head "$m"; fail "the manifest after the switch"; }
expect_usage_error "a Muon knob without Muon" "$BIN" $(train_args "$DATA" "$W/bad") $COMMON \
  --max-steps 1 --muon-momentum 0.9
grep -q -- "--muon-momentum" <<<"$out" || { echo "$out" | tail -5; fail "the knob is not named"; }
expect_usage_error "--muon-lr with --muon-lr-ratio" "$BIN" $(train_args "$DATA" "$W/bad") $COMMON \
  --max-steps 1 --optimizer muon --muon-lr 1e-2 --muon-lr-ratio 5
grep -q -- "--muon-lr-ratio" <<<"$out" || { echo "$out" | tail -5; fail "the conflict is not named"; }
echo PASS
