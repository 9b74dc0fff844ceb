#!/usr/bin/env bash
# Objectives on the real SmolLM2 features of the serving tier (docs/benchmarks.md "Objectives"):
# the same draft, data, steps and seeds trained with SpecForge's soft cross-entropy, its LK
# lambda and alpha losses, and speculators' per-row lk_hybrid; held-out accept_len / acc_0 /
# acceptance_rate_0 after training, per seed and averaged.
#   bash benchmarks/objectives/bench.sh [BUILD_DIR]   (after launch/setup.sh and setup-serving.sh)
#   SEEDS (default "0 1"), EPOCHS (default 6), OUT override the defaults.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64
source "$REPO/benchmarks/serving/cache.sh"
bench_tools "${1:-}"
require_serving_tools
stage() { echo "[bench] $*"; }  # build_serving_cache reports with it
C="$(serving_cache_dir)"
OUT="${OUT:-$BUILD/objectives_bench}" SEEDS="${SEEDS:-0 1}" EPOCHS="${EPOCHS:-6}"
rm -rf "$OUT"; mkdir -p "$OUT" "$C"
build_serving_cache "$C" "$OUT"
declare -A FLAGS=([soft_ce]="" [lk_lambda]="--lk-loss-type lambda" [lk_alpha]="--lk-loss-type alpha"
                  [lk_hybrid]="--loss-fn lk_hybrid")
for seed in $SEEDS; do
  for name in soft_ce lk_lambda lk_alpha lk_hybrid; do
    echo "[objectives] $name, seed $seed"
    "$BIN" --target-model-path "$C/target" --draft-model-config "$C/draft-config.json" \
      --train-hidden-states-path "$C/feat-train" --eval-hidden-states-path "$C/feat-eval" \
      --output-dir "$OUT/$name-$seed" --cache-dir "$OUT/cache" --num-epochs "$EPOCHS" \
      --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 \
      --warmup-ratio 0.05 --max-length 256 --ttt-length 3 --save-interval 0 --eval-interval "$EPOCHS" \
      --seed "$seed" ${FLAGS[$name]} >"$OUT/$name-$seed.log" 2>&1 || { tail -20 "$OUT/$name-$seed.log"; exit 1; }
  done
done
"$PY" - "$OUT" $SEEDS <<'PYEOF'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
keys = ["eval/accept_len", "eval/acc_0", "eval/acceptance_rate_0"]
print("| objective | " + " | ".join(f"accept_len seed {s}" for s in seeds) + " | mean accept_len | mean acc_0 | mean acceptance_rate_0 |")
print("|---|" + "---|" * (len(seeds) + 3))
res = {}
for name in ["soft_ce", "lk_lambda", "lk_alpha", "lk_hybrid"]:
    rows = []
    for s in seeds:
        ev = [json.loads(l) for l in open(f"{out}/{name}-{s}/metrics.jsonl") if '"eval/accept_len"' in l][-1]
        rows.append({k: ev[k] for k in keys})
    res[name] = rows
    mean = {k: statistics.mean(r[k] for r in rows) for k in keys}
    print(f"| {name} | " + " | ".join(f"{r['eval/accept_len']:.4f}" for r in rows) +
          f" | {mean['eval/accept_len']:.4f} | {mean['eval/acc_0']:.4f} | {mean['eval/acceptance_rate_0']:.4f} |")
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
PYEOF
