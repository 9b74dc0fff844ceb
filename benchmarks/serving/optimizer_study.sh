#!/usr/bin/env bash
# AdamW against Muon, each with SpecForge's soft cross-entropy and with the LK lambda loss, judged
# by vLLM 0.32 (CPU build) serving the drafts (docs/benchmarks.md "Optimizers and objectives,
# served"). On the serving tier's cached SmolLM2 features (the target's own replies):
#  1. a learning-rate sweep per optimizer (soft cross-entropy, seed 0): held-out loss and
#     fsdp-train's accept_len on the held-out features; the best accept_len picks the optimizer's
#     learning rate (ties: the lower held-out loss);
#  2. at each optimizer's picked learning rate, {soft_ce, lk_lambda} x SEEDS: the same steps and
#     data; every draft served by vLLM on the same held-out prompts with k speculative tokens.
# Reports per draft the engine's acceptance length and per-position rates, fsdp-train's
# accept_len, the held-out loss and training tokens/s; per setting the mean and the seed spread
# (max - min). Results: $OUT/results.json and Markdown tables on stdout.
#   bash benchmarks/serving/optimizer_study.sh [BUILD_DIR]   (after launch/setup.sh and
#   launch/setup-serving.sh; K, EPOCHS, SEEDS, ADAMW_LRS, MUON_LRS, OUT override the defaults;
#   KEEP=1 keeps OUT and reuses the runs and engine results already there, e.g. after widening a
#   sweep whose best learning rate was at its edge)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64  # the serving tier's cache
K="${K:-3}" EPOCHS="${EPOCHS:-6}" SEEDS="${SEEDS:-0 1}"
ADAMW_LRS="${ADAMW_LRS:-1e-3 2e-3 4e-3}"
MUON_LRS="${MUON_LRS:-2.5e-4 5e-4 1e-3 2e-3 4e-3}"  # --learning-rate; Muon's own is 10x
source "$REPO/benchmarks/serving/cache.sh"
bench_tools "${1:-}"
require_serving_tools
C="$(serving_cache_dir)"
OUT="${OUT:-$BUILD/optimizer_study}"
[ "${KEEP:-0}" = 1 ] || rm -rf "$OUT"
mkdir -p "$C" "$OUT"
t0=$(date +%s)
stage() { echo "[optimizer-study] $(( $(date +%s) - t0 ))s: $*"; }
build_serving_cache "$C" "$OUT"

declare -A LOSS=([soft_ce]="" [lk_lambda]="--lk-loss-type lambda")
# train NAME OPTIMIZER LR OBJECTIVE SEED: one draft, evaluated on the held-out features at the end.
train() {
  local name="$1" opt="$2" lr="$3" obj="$4" seed="$5"
  [ -f "$OUT/$name/metrics.jsonl" ] && return 0
  stage "training $name"
  cache_step "$OUT/train-$name.log" "$BIN" --target-model-path "$C/target" \
    --draft-model-config "$C/draft-config.json" --train-hidden-states-path "$C/feat-train" \
    --eval-hidden-states-path "$C/feat-eval" --output-dir "$OUT/$name" --cache-dir "$OUT/cache" \
    --num-epochs "$EPOCHS" --draft-global-batch-size 4 --draft-micro-batch-size 4 \
    --learning-rate "$lr" --warmup-ratio 0.05 --max-length 256 --ttt-length "$K" \
    --save-interval "$EPOCHS" --eval-interval "$EPOCHS" --export-dtype fp32 --log-steps 10 \
    --seed "$seed" --optimizer "$opt" ${LOSS[$obj]}
}
# pick OPTIMIZER: the swept learning rate with the best held-out accept_len.
pick() {
  "$PY" - "$OUT" "$1" <<'PYEOF'
import json, sys
out, opt = sys.argv[1], sys.argv[2]
import glob, os
best = None
for d in sorted(glob.glob(f"{out}/sweep-{opt}-*")):
    ev = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"eval/accept_len"' in l][-1]
    key = (ev["eval/accept_len"], -ev["eval/loss"])
    if best is None or key > best[0]:
        best = (key, os.path.basename(d).split("-", 2)[2])
print(best[1])
PYEOF
}

for opt in adamw muon; do
  lrs="$ADAMW_LRS"; [ $opt = muon ] && lrs="$MUON_LRS"
  for lr in $lrs; do train "sweep-$opt-$lr" $opt "$lr" soft_ce 0; done
done
declare -A BEST=([adamw]="$(pick adamw)" [muon]="$(pick muon)")
stage "picked learning rates: AdamW ${BEST[adamw]}, Muon ${BEST[muon]} (Muon's own 10x)"

stage "vLLM, the target alone"
[ -f "$OUT/spec-none.json" ] ||
  cache_step "$OUT/spec-none.log" "$VPY" "$PIPE" generate --target "$C/target" --prompts "$C/prompts.json" \
  --sets eval --max-tokens "$MAX_TOKENS" --out "$OUT/spec-none.json"
for opt in adamw muon; do
  for obj in soft_ce lk_lambda; do
    for seed in $SEEDS; do
      name="$opt-${BEST[$opt]}-$obj-$seed"
      if [ $obj = soft_ce ] && [ "$seed" = 0 ]; then
        ln -sfn "sweep-$opt-${BEST[$opt]}" "$OUT/$name"  # the sweep's run is this one
      else
        train "$name" $opt "${BEST[$opt]}" $obj "$seed"
      fi
      [ -f "$OUT/spec-$name.json" ] && continue
      stage "vLLM with the $name draft (k=$K)"
      ck="$(ls -d "$OUT/$name"/epoch_* | sort -V | tail -n 1)"
      cache_step "$OUT/spec-$name.log" "$VPY" "$PIPE" generate --target "$C/target" \
        --prompts "$C/prompts.json" --sets eval --max-tokens "$MAX_TOKENS" --draft "$ck" --k "$K" \
        --out "$OUT/spec-$name.json"
    done
  done
done
stage "done"

"$PY" - "$OUT" "$K" "$EPOCHS" "${BEST[adamw]}" "${BEST[muon]}" $SEEDS <<'PYEOF'
import glob, json, os, statistics, sys
out, k, epochs, lr_adamw, lr_muon, seeds = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                             sys.argv[4], sys.argv[5], sys.argv[6:])
def train_metrics(d):
    recs = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    ev = [r for r in recs if "eval/accept_len" in r][-1]
    tps = [r["perf/tokens_per_s"] for r in recs if "perf/tokens_per_s" in r][1:]
    return {"fsdp_train_accept_len": ev["eval/accept_len"], "eval_loss": ev["eval/loss"],
            "eval_acc_0": ev.get("eval/acc_0"),
            "train_tokens_per_s": statistics.median(tps) if tps else None}
res = {"k": k, "epochs": epochs, "picked_lr": {"adamw": lr_adamw, "muon": lr_muon},
       "sweep": {}, "runs": {}}
print("Learning-rate sweep (soft cross-entropy, seed 0; Muon's own learning rate is 10x):\n")
print("| optimizer | --learning-rate | held-out loss | fsdp-train accept_len | train tokens/s |")
print("|---|---|---|---|---|")
def sweep_key(p):
    _, opt, lr = os.path.basename(p).split("-", 2)
    return opt, float(lr)
for d in sorted(glob.glob(f"{out}/sweep-*"), key=sweep_key):
    _, opt, lr = os.path.basename(d).split("-", 2)
    m = train_metrics(d)
    res["sweep"][f"{opt}-{lr}"] = m
    mark = " (picked)" if lr == res["picked_lr"][opt] else ""
    print(f"| {opt} | {lr}{mark} | {m['eval_loss']:.4f} | {m['fsdp_train_accept_len']:.4f} | "
          f"{m['train_tokens_per_s']:.0f} |")
base = json.load(open(f"{out}/spec-none.json"))
print("\nServed by vLLM (k = %d), per draft:\n" % k)
print("| optimizer | objective | seed | vLLM accept len | accepted at pos 1..k | fsdp-train accept_len "
      "| held-out loss | train tokens/s | identical outputs |")
print("|---|---|---|---|---|---|---|---|---|")
for opt in ["adamw", "muon"]:
    for obj in ["soft_ce", "lk_lambda"]:
        for seed in seeds:
            name = f"{opt}-{res['picked_lr'][opt]}-{obj}-{seed}"
            s = json.load(open(f"{out}/spec-{name}.json"))
            same = sum(a["generated_ids"] == b["generated_ids"]
                       for a, b in zip(base["outputs"]["eval"], s["outputs"]["eval"]))
            r = dict(train_metrics(f"{out}/{name}"),
                     engine_accept_len=s["spec"]["mean_acceptance_length"],
                     engine_per_position=s["spec"]["acceptance_rate_per_position"],
                     identical_outputs=f"{same}/{len(base['outputs']['eval'])}")
            res["runs"][name] = r
            pos = " / ".join(f"{x:.3f}" for x in r["engine_per_position"])
            print(f"| {opt} | {obj} | {seed} | {r['engine_accept_len']:.4f} | {pos} | "
                  f"{r['fsdp_train_accept_len']:.4f} | {r['eval_loss']:.4f} | "
                  f"{r['train_tokens_per_s']:.0f} | {r['identical_outputs']} |")
print("\nPer setting, over the seeds (spread = max - min):\n")
print("| optimizer | objective | vLLM accept len mean | spread | fsdp-train accept_len mean | spread "
      "| held-out loss mean | spread |")
print("|---|---|---|---|---|---|---|---|")
res["settings"] = {}
for opt in ["adamw", "muon"]:
    for obj in ["soft_ce", "lk_lambda"]:
        rows = [res["runs"][f"{opt}-{res['picked_lr'][opt]}-{obj}-{s}"] for s in seeds]
        agg = {}
        for key in ["engine_accept_len", "fsdp_train_accept_len", "eval_loss"]:
            v = [r[key] for r in rows]
            agg[key] = {"mean": statistics.mean(v), "spread": max(v) - min(v)}
        res["settings"][f"{opt}-{obj}"] = agg
        print(f"| {opt} | {obj} | " + " | ".join(
            f"{agg[key]['mean']:.4f} | {agg[key]['spread']:.4f}"
            for key in ["engine_accept_len", "fsdp_train_accept_len", "eval_loss"]) + " |")
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
PYEOF
