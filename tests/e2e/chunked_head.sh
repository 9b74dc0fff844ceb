#!/usr/bin/env bash
# --head-chunk-rows end to end (docs/model.md "Chunked head and loss"): 2 ranks with the draft head
# in chunks of 5 loss rows train to the fp32 weights of the unchunked head and log the same
# accuracies and losses; a chunk size below -1 is refused at start-up.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/chunked_head"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --num-epochs 1 --max-steps 4"
for chunk in -1 5; do
  run_np 2 $(train_args "$DATA" "$W/c$chunk") $COMMON --head-chunk-rows "$chunk" \
    >"$W/c$chunk.log" 2>&1 || { tail -20 "$W/c$chunk.log"; fail "--head-chunk-rows $chunk at 2 ranks"; }
done
compare_exports "$(latest_ckpt "$W/c-1")" "$(latest_ckpt "$W/c5")" 1e-5 || fail "chunked head trained other weights"
"$PY" - "$W/c-1/metrics.jsonl" "$W/c5/metrics.jsonl" <<'PYEOF' || fail "chunked head logged other metrics"
import json, sys
def load(path):
    return [r for r in map(json.loads, open(path)) if "train/loss" in r]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    for k, v in x.items():
        if k.startswith("train/acc_"):
            assert v == y[k], (k, v, y[k])
        elif k.startswith("train/loss") or k.startswith("train/ploss_"):
            assert abs(v - y[k]) <= 1e-5 * max(1.0, abs(v)), (k, v, y[k])
print("same accuracies, losses within 1e-5")
PYEOF
expect_usage_error "chunk size -2" "$BIN" $(train_args "$DATA" "$W/bad") --head-chunk-rows -2 --max-steps 1
grep -q -- "--head-chunk-rows" <<<"$out" || { echo "$out"; fail "the refusal does not name --head-chunk-rows"; }
echo PASS
