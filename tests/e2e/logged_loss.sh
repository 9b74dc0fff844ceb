#!/usr/bin/env bash
# The logged loss is the trained objective, end to end (docs/model.md "The logged objective"):
# with --ttt-step-loss-decay 0.5 and a --loss-fn mix, and with 1.0 and SpecForge's LK alpha,
# every train/loss, train_epoch/loss and eval/loss equals sum_i decay^i ploss_i of the same
# record within 1e-6 relative, and differs from the fixed 0.8^i weighting it replaced. Both
# acceptance rates are logged, SpecForge's (the target's own probabilities) at most the
# renormalised one.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data logged_loss --num-samples 32 --min-len 32 --max-len 32 --samples-per-dir 16 --seed 3)
W="$BUILD/e2e_work/logged_loss"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --num-epochs 1 --eval-hidden-states-path $DATA/eval_hidden_states --eval-steps 2"
check() {  # check OUT DECAY
  "$PY" - "$1/metrics.jsonl" "$2" <<'PYEOF'
import json, sys
decay, T, seen = float(sys.argv[2]), 3, set()
weighted = lambda p, d: sum(d ** i * x for i, x in enumerate(p))
for r in map(json.loads, open(sys.argv[1])):
    for prefix in ("train", "train_epoch", "eval"):
        if prefix + "/loss" not in r:
            continue
        loss, ploss = r[prefix + "/loss"], [r[f"{prefix}/ploss_{i}"] for i in range(T)]
        want = weighted(ploss, decay)
        assert abs(loss - want) <= 1e-6 * abs(want), (prefix, r["step"], loss, want)
        if decay != 0.8:
            assert abs(loss - weighted(ploss, 0.8)) > 1e-3 * abs(want), (prefix, r["step"], loss)
        for i in range(T):
            own, renorm = r[f"{prefix}/acceptance_rate_{i}"], r[f"{prefix}/acceptance_rate_renorm_{i}"]
            assert 0 <= own <= renorm + 1e-6, (prefix, r["step"], i, own, renorm)
        seen.add(prefix)
assert seen == {"train", "train_epoch", "eval"}, seen
print("logged loss: every record is sum_i", decay, "^i ploss_i")
PYEOF
}
run_np 1 $(train_args "$DATA" "$W/mix") $COMMON --ttt-step-loss-decay 0.5 \
  --loss-fn '{"kl_div": 0.5, "tv": 0.3, "jsd": 0.2}' >"$W/mix.log" 2>&1 || { tail -20 "$W/mix.log"; fail "training with a loss mix"; }
check "$W/mix" 0.5 || fail "the logged loss is not the mix's objective with decay 0.5"
run_np 1 $(train_args "$DATA" "$W/lk") $COMMON --ttt-step-loss-decay 1.0 --lk-loss-type alpha \
  >"$W/lk.log" 2>&1 || { tail -20 "$W/lk.log"; fail "training with LK alpha"; }
check "$W/lk" 1.0 || fail "the logged loss is not LK alpha's objective with decay 1.0"
echo PASS
