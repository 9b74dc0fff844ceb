#!/usr/bin/env bash
# --packing end to end (docs/usage.md "Packing"): on samples of 1 to 96 tokens (truncated at
# --max-length 64, so several of exactly max length) the packed run equals the unpacked
# micro-batch-1 run in fp32 at 1, 2, 3 and 4 ranks: per-step losses and gradient norms within
# 1e-6, the same accuracies and acceptance, the weights after 3 steps within 1e-6 (relative L2);
# with a larger budget too (fewer micro-batches per step); MFU and tokens/s count real tokens;
# a budget below --max-length is refused at start-up.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data varied --num-samples 64 --min-len 2 --max-len 96 --samples-per-dir 16 --seed 3)
W="$BUILD/e2e_work/packing"; rm -rf "$W"; mkdir -p "$W"
# A sample of a single token (no loss row) among them.
if [ ! -f "$DATA/hidden_states/rows_0-16/single_token.ckpt" ]; then
  "$PY" - "$DATA/hidden_states/rows_0-16/single_token.ckpt" <<'PYEOF' || fail "writing a one-token sample"
import sys, torch
H = 64
torch.save({"input_ids": torch.tensor([5]), "loss_mask": torch.tensor([1]),
            "hidden_state": torch.randn(1, 1, H).bfloat16(),
            "aux_hidden_state": torch.randn(1, 1, 3 * H).bfloat16()}, sys.argv[1])
PYEOF
fi
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 12 --save-interval 0 --num-epochs 1 --max-steps 3"

same_run() {  # same_run A B: per-step metrics and exported weights agree
  "$PY" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PYEOF' || return 1
import json, sys
def load(path):
    return [r for r in map(json.loads, open(path)) if "train/loss" in r]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    for k, v in x.items():
        if k.startswith("train/acc_") or k.startswith("train/accept_len") or k.startswith("train/cond_acc_"):
            assert abs(v - y[k]) <= 1e-9, (k, v, y[k])
        elif k.startswith("train/") and k != "train/epoch":
            assert abs(v - y[k]) <= 1e-6 * max(1.0, abs(v)), (k, v, y[k])
print("same metrics (losses and gradient norms within 1e-6)")
PYEOF
  compare_exports "$(latest_ckpt "$1")" "$(latest_ckpt "$2")" 1e-6
}

for np in 1 2 3 4; do
  for mode in plain packed; do
    extra=""; [ "$mode" = packed ] && extra="--packing"
    run_np "$np" $(train_args "$DATA" "$W/$mode$np") $COMMON $extra >"$W/$mode$np.log" 2>&1 ||
      { tail -20 "$W/$mode$np.log"; fail "$mode at $np ranks"; }
  done
  same_run "$W/plain$np" "$W/packed$np" || fail "packed != unpacked at $np ranks"
done
# A budget of several max-length samples: fewer, fuller micro-batches, the same step.
run_np 2 $(train_args "$DATA" "$W/big2") $COMMON --packing --packing-budget 200 >"$W/big2.log" 2>&1 ||
  { tail -20 "$W/big2.log"; fail "--packing-budget 200 at 2 ranks"; }
same_run "$W/plain2" "$W/big2" || fail "packed (budget 200) != unpacked at 2 ranks"

# Throughput and MFU count the same real tokens packed or not.
"$PY" - "$W/plain2/metrics.jsonl" "$W/big2/metrics.jsonl" <<'PYEOF' || fail "token accounting differs"
import json, sys
def steps(path):
    return [r for r in map(json.loads, open(path)) if "perf/tokens_per_s" in r]
for a, b in zip(steps(sys.argv[1]), steps(sys.argv[2])):
    ta = a["perf/tokens_per_s"] * a["perf/step_time_s"]
    tb = b["perf/tokens_per_s"] * b["perf/step_time_s"]
    assert abs(ta - tb) <= 1e-6 * ta, (ta, tb)
    # 6 samples per rank and step unpacked; a 200-token budget packs them into fewer.
    assert a["perf/micro_batches_per_step"] == 6, a["perf/micro_batches_per_step"]
    assert 1 <= b["perf/micro_batches_per_step"] < 6, b["perf/micro_batches_per_step"]
print("same tokens per step, fewer micro-batches")
PYEOF

expect_usage_error "budget below max length" "$BIN" $(train_args "$DATA" "$W/bad") --packing --packing-budget 32 --max-steps 1
grep -q -- "--packing-budget" <<<"$out" || { echo "$out"; fail "the refusal does not name --packing-budget"; }
echo PASS
