#!/usr/bin/env bash
# P-EAGLE (parallel drafting) against EAGLE3, judged by vLLM 0.32 (CPU build): both drafts trained
# by fsdp-train on the same features (the target's own replies, the serving tier's cache) for the
# same steps, served on the same held-out prompts with k speculative tokens (EAGLE3 drafting one
# token per pass, P-EAGLE all k in one pass), plus the target alone. Reports the engine's mean
# acceptance length and per-position rates, fsdp-train's accept_len on the generated sequences,
# and the engine's wall time per output token (generate time / generated tokens, one process per
# run, the same prompts and batch). Results: $OUT/results.json and a Markdown table
# (docs/benchmarks.md "P-EAGLE against EAGLE3, served").
#   bash benchmarks/serving/parallel_drafting.sh [BUILD_DIR]   (after launch/setup.sh and
#   launch/setup-serving.sh; K, EPOCHS, DEPTHS, OUT override the defaults below)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64  # the serving tier's cache
K="${K:-3}" EPOCHS="${EPOCHS:-6}" DEPTHS="${DEPTHS:-$K}"
source "$REPO/benchmarks/serving/cache.sh"
bench_tools "${1:-}"
require_serving_tools
C="$(serving_cache_dir)"
OUT="${OUT:-$BUILD/parallel_drafting_bench}"
rm -rf "$OUT"
mkdir -p "$C" "$OUT"
t0=$(date +%s)
stage() { echo "[parallel-drafting] $(( $(date +%s) - t0 ))s: $*"; }
build_serving_cache "$C" "$OUT"
"$PY" - "$C/draft-config.json" "$OUT/peagle.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
json.dump(dict(c, architectures=["PEagleDraftModel"], mask_token_id=c["vocab_size"] - 1),
          open(sys.argv[2], "w"), indent=1)
PYEOF

common="--target-model-path $C/target --train-hidden-states-path $C/feat-train --num-epochs $EPOCHS \
  --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 --warmup-ratio 0.05 \
  --max-length 256 --export-dtype fp32 --save-interval 0 --log-steps 50"
for d in eagle3 peagle; do
  if [ $d = eagle3 ]; then cfg="$C/draft-config.json" steps="--ttt-length $K"
  else cfg="$OUT/peagle.json" steps="--num-depths $DEPTHS"; fi
  stage "training the $d draft ($EPOCHS epochs)"
  cache_step "$OUT/train-$d.log" "$BIN" $common --draft-model-config "$cfg" $steps \
    --output-dir "$OUT/run-$d" --cache-dir "$OUT/cache-$d"
  ck="$(ls -d "$OUT/run-$d"/epoch_* | sort -V | tail -n 1)"
  ln -sfn "$ck" "$OUT/draft-$d"
  [ $d = eagle3 ] && ecfg="$ck/config.json" esteps="--ttt-length $K" || { ecfg="$cfg"; esteps="--num-depths $K"; }
  stage "fsdp-train's accept_len of the $d draft on the generated held-out sequences"
  cache_step "$OUT/eval-$d.log" "$BIN" --init-checkpoint "$ck" --eval-only --target-model-path "$C/target" \
    --draft-model-config "$ecfg" --eval-hidden-states-path "$C/feat-eval" --cache-dir "$OUT/cache-$d" \
    --max-length 512 $esteps --mixed-precision fp32 --draft-global-batch-size 1 \
    --draft-micro-batch-size 1 --output-dir "$OUT/eval-$d"
done
stage "vLLM, the target alone"
cache_step "$OUT/spec-none.log" "$VPY" "$PIPE" generate --target "$C/target" --prompts "$C/prompts.json" \
  --sets eval --max-tokens "$MAX_TOKENS" --out "$OUT/spec-none.json"
for d in eagle3 peagle; do
  stage "vLLM with the $d draft (k=$K)"
  cache_step "$OUT/spec-$d.log" "$VPY" "$PIPE" generate --target "$C/target" --prompts "$C/prompts.json" \
    --sets eval --max-tokens "$MAX_TOKENS" --draft "$OUT/draft-$d" --k "$K" \
    $([ $d = peagle ] && echo --parallel-drafting) --out "$OUT/spec-$d.json"
done
stage "done"

"$PY" - "$OUT" "$K" "$EPOCHS" <<'PYEOF'
import json, sys
out, k, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = json.load(open(f"{out}/spec-none.json"))
def tokens(run):
    return sum(len(o["generated_ids"]) for o in run["outputs"]["eval"])
res = {"k": k, "epochs": epochs, "runs": {}}
res["runs"]["none"] = {"generate_s": base["generate_s"], "tokens": tokens(base),
                       "ms_per_token": 1000 * base["generate_s"] / tokens(base)}
for d in ["eagle3", "peagle"]:
    s = json.load(open(f"{out}/spec-{d}.json"))
    same = sum(a["generated_ids"] == b["generated_ids"]
               for a, b in zip(base["outputs"]["eval"], s["outputs"]["eval"]))
    ev = [json.loads(l) for l in open(f"{out}/eval-{d}/metrics.jsonl") if "eval/accept_len" in l]
    res["runs"][d] = {"engine_accept_len": s["spec"]["mean_acceptance_length"],
                      "engine_per_position": s["spec"]["acceptance_rate_per_position"],
                      "drafts": s["spec"]["num_drafts"], "identical_outputs": f"{same}/{len(base['outputs']['eval'])}",
                      "fsdp_train_accept_len": ev[-1]["eval/accept_len"] if ev else None,
                      "generate_s": s["generate_s"], "tokens": tokens(s),
                      "ms_per_token": 1000 * s["generate_s"] / tokens(s)}
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
print("| run | vLLM accept len | accepted at pos 1..k | fsdp-train accept_len | ms per output token | identical outputs |")
print("|---|---|---|---|---|---|")
for d, r in res["runs"].items():
    if d == "none":
        print(f"| target alone | - | - | - | {r['ms_per_token']:.1f} | - |")
        continue
    pos = " / ".join(f"{x:.3f}" for x in r["engine_per_position"])
    print(f"| {d} | {r['engine_accept_len']:.3f} | {pos} | {r['fsdp_train_accept_len']:.3f} | "
          f"{r['ms_per_token']:.1f} | {r['identical_outputs']} |")
PYEOF
