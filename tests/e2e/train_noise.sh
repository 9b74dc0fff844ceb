#!/usr/bin/env bash
# Noise augmentation (--noise-std, docs/usage.md "Noise augmentation"): the noise of a sample
# depends only on (--seed, epoch, sample), so a run stopped and resumed across an epoch boundary
# ends bitwise equal to an uninterrupted one, 1 and 2 ranks reach the same weights, and the noise
# changes training (the run without it differs by far more than the 1-vs-2-rank tolerance). A
# resume with other noise settings warns; a negative --noise-std is refused naming the flag.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/train_noise"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --save-interval 0 --eval-interval 0"
NOISE="--noise-std 0.05"

# 1 rank, 96 samples, 24 steps per epoch: 28 steps straight vs 20 + resume to 28 (the resume
# crosses into epoch 1, whose noise differs from epoch 0's).
RES="$COMMON $NOISE --noise-type gaussian --draft-global-batch-size 4 --draft-micro-batch-size 4 --num-epochs 2"
"$BIN" $(train_args "$DATA" "$W/full") $RES --max-steps 28 >"$W/full.log" 2>&1 ||
  { cat "$W/full.log"; fail "uninterrupted run"; }
grep -q "noise augmentation: gaussian" "$W/full.log" || { cat "$W/full.log"; fail "no noise line in the log"; }
"$BIN" $(train_args "$DATA" "$W/part") $RES --max-steps 20 >"$W/part1.log" 2>&1 ||
  { cat "$W/part1.log"; fail "first part"; }
cp -r "$W/part" "$W/changed"
"$BIN" $(train_args "$DATA" "$W/part") $RES --max-steps 28 --resume >"$W/part2.log" 2>&1 ||
  { cat "$W/part2.log"; fail "resumed part"; }
grep -q "resumed from .*epoch_0_step_20" "$W/part2.log" || { cat "$W/part2.log"; fail "did not resume from step 20"; }
compare_exports "$(latest_ckpt "$W/full")" "$(latest_ckpt "$W/part")" 0 || fail "resume with noise is not bitwise exact"
# Other noise settings on resume: allowed (like a changed learning rate), never silently.
"$BIN" $(train_args "$DATA" "$W/changed") $COMMON --noise-std 0.1 --draft-global-batch-size 4 \
  --draft-micro-batch-size 4 --num-epochs 2 --max-steps 21 --resume >"$W/changed.log" 2>&1 ||
  { cat "$W/changed.log"; fail "resume with another --noise-std"; }
grep -qF 'noise_std 0.05 -> 0.1, noise_type "gaussian" -> "uniform"' "$W/changed.log" ||
  { cat "$W/changed.log"; fail "no warning for changed noise settings on resume"; }

# 1 vs 2 ranks, micro-batch 1, same global batch (2): same weights (uniform noise, the default).
for np in 1 2; do
  run_np $np $(train_args "$DATA" "$W/np$np") $COMMON $NOISE --draft-global-batch-size 2 \
    --draft-micro-batch-size 1 --num-epochs 1 --max-steps 8 >"$W/np$np.log" 2>&1 ||
    { cat "$W/np$np.log"; fail "noise run at $np rank(s)"; }
done
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2")" 1e-5 || fail "noise: 1 vs 2 ranks"
# Without noise the same run ends elsewhere: the noise is really applied.
"$BIN" $(train_args "$DATA" "$W/clean") $COMMON --draft-global-batch-size 2 --draft-micro-batch-size 1 \
  --num-epochs 1 --max-steps 8 >"$W/clean.log" 2>&1 || { cat "$W/clean.log"; fail "run without noise"; }
grep -q "noise augmentation" "$W/clean.log" && fail "noise announced in a run without --noise-std"
if compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/clean")" 1e-5 >"$W/cmp.log"; then
  fail "--noise-std 0.05 trained the same weights as no noise: $(cat "$W/cmp.log")"
fi
echo "with vs without noise: $(cat "$W/cmp.log")"

expect_usage_error "a negative --noise-std" "$BIN" $(train_args "$DATA" "$W/bad") --noise-std -0.1
grep -qF -- "--noise-std -0.1 is negative" <<<"$out" || { echo "$out"; fail "a negative --noise-std"; }
expect_usage_error "an unknown --noise-type" "$BIN" $(train_args "$DATA" "$W/bad") --noise-type laplace
grep -qF -- "--noise-type: 'laplace' is not one of uniform, gaussian" <<<"$out" ||
  { echo "$out"; fail "an unknown --noise-type"; }
expect_usage_error "--noise-type without --noise-std" "$BIN" $(train_args "$DATA" "$W/bad") --noise-type gaussian
grep -qF -- "without --noise-std" <<<"$out" || { echo "$out"; fail "--noise-type without --noise-std"; }
echo "PASS"
