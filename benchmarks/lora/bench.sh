#!/usr/bin/env bash
# LoRA adaptation against full fine-tuning on the real SmolLM2 features of the serving tier
# (docs/benchmarks.md "LoRA"): a base draft is trained, then fine-tuned from it for the same
# steps on the same samples (a) whole and (b) with LoRA adapters of two ranks; per run: tokens/s
# (median over the logged steps after the first), peak host RSS, the sharded state per rank, the
# training state on disk, and the held-out accept_len / acc_0 after the fine-tune.
#   bash benchmarks/lora/bench.sh [BUILD_DIR]     (after launch/setup.sh and launch/setup-serving.sh)
#   EPOCHS (fine-tune epochs, default 3), RANKS (default "16 64"), OUT override the defaults.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64
source "$REPO/benchmarks/serving/cache.sh"
bench_tools "${1:-}"
require_serving_tools
stage() { echo "[bench] $*"; }  # build_serving_cache reports with it
C="$(serving_cache_dir)"
OUT="${OUT:-$BUILD/lora_bench}"
EPOCHS="${EPOCHS:-3}" RANKS="${RANKS:-16 64}"
rm -rf "$OUT"; mkdir -p "$OUT" "$C"
build_serving_cache "$C" "$OUT"
COMMON=(--target-model-path "$C/target" --train-hidden-states-path "$C/feat-train"
        --eval-hidden-states-path "$C/feat-eval" --max-length 256 --ttt-length 3
        --draft-global-batch-size 4 --draft-micro-batch-size 4 --warmup-ratio 0.05
        --save-interval 0 --log-steps 1 --export-for vllm)

echo "[lora-bench] base draft (6 epochs)"
"$BIN" "${COMMON[@]}" --draft-model-config "$C/draft-config.json" --output-dir "$OUT/base" \
  --cache-dir "$OUT/cache" --num-epochs 6 --learning-rate 2e-3 >"$OUT/base.log" 2>&1 ||
  { tail -20 "$OUT/base.log"; exit 1; }
BASE="$(ls -d "$OUT/base"/epoch_* | sort -V | tail -n 1)"

run() {  # run NAME FLAGS...: a fine-tune from BASE
  local name="$1"; shift
  echo "[lora-bench] $name ($EPOCHS epochs)"
  "$BIN" "${COMMON[@]}" --draft-model-config "$BASE/config.json" --init-checkpoint "$BASE" \
    --output-dir "$OUT/$name" --cache-dir "$OUT/cache" --num-epochs "$EPOCHS" "$@" \
    >"$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log"; exit 1; }
}
run full --learning-rate 5e-4
names=(full)
for r in $RANKS; do
  run "lora$r" --learning-rate 2e-3 --lora-rank "$r" --lora-alpha $((2 * r))
  names+=("lora$r")
done

"$PY" - "$OUT" "${names[@]}" <<'PYEOF'
import json, os, re, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
print("| run | trained parameters | tokens/s | peak host RSS GiB | sharded state MiB | training state on disk MiB | held-out accept_len | held-out acc_0 |")
print("|---|---|---|---|---|---|---|---|")
res = {}
for n in names:
    rows = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl")]
    tps = [r["perf/tokens_per_s"] for r in rows if "perf/tokens_per_s" in r][1:]
    rss = max(r.get("mem/host_peak_rss_gib", 0) for r in rows)
    ev = [r for r in rows if "eval/accept_len" in r][-1]
    log = open(f"{out}/{n}.log").read()
    trained = int(re.search(r"draft: (\d+) trainable parameters", log).group(1))
    state = re.search(r"sharded state per rank: ([0-9.]+) MiB", log)
    ck = sorted((d for d in os.listdir(f"{out}/{n}") if d.startswith("epoch_")),
                key=lambda d: int(d.rsplit("_", 1)[1]))[-1]
    disk = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(f"{out}/{n}/{ck}/train_state") for f in fs)
    res[n] = dict(trained=trained, tokens_per_s=statistics.median(tps), rss_gib=rss,
                  state_mib=float(state.group(1)) if state else None, disk_mib=disk / 2**20,
                  accept_len=ev["eval/accept_len"], acc_0=ev["eval/acc_0"])
    r = res[n]
    print(f"| {n} | {trained:,} | {r['tokens_per_s']:.0f} | {rss:.2f} | {r['state_mib'] if r['state_mib'] is not None else '-'} | "
          f"{r['disk_mib']:.1f} | {r['accept_len']:.4f} | {r['acc_0']:.4f} |")
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
PYEOF
