#!/usr/bin/env bash
# Served acceptance of drafts trained on the target's own greedy replies (SpecForge's data
# regeneration) against drafts trained on the human-written replies, measured by vLLM 0.32 (CPU
# build) on held-out prompts; plus the same regenerated draft exported the way SpecForge writes
# its config (vLLM then reads other target layers), and fsdp-train's own acceptance metrics on the
# sequences vLLM generated. Results: $OUT/results.json and a Markdown table (docs/benchmarks.md).
#   bash benchmarks/serving/run.sh [BUILD_DIR]      (after launch/setup.sh and launch/setup-serving.sh)
#   NUM_TRAIN, NUM_EVAL, EPOCHS, K, MAX_TOKENS, OUT override the defaults below.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Defaults: the serving tier's sizes (tests/serving/vllm_acceptance.sh), so its cached target,
# prompts, generation and features are reused.
NUM_TRAIN="${NUM_TRAIN:-48}" NUM_EVAL="${NUM_EVAL:-12}" EPOCHS="${EPOCHS:-6}" K="${K:-3}"
MAX_TOKENS="${MAX_TOKENS:-64}"
source "$REPO/benchmarks/serving/cache.sh"
bench_tools "${1:-}"
require_serving_tools
C="$(serving_cache_dir)"
[ "$NUM_TRAIN $NUM_EVAL $MAX_TOKENS" = "48 12 64" ] || C="$C-$NUM_TRAIN-$NUM_EVAL-$MAX_TOKENS"
OUT="${OUT:-$BUILD/serving_bench}"
rm -rf "$OUT"
mkdir -p "$C" "$OUT"
t0=$(date +%s)
stage() { echo "[serving-bench] $(( $(date +%s) - t0 ))s: $*"; }

T="$C/target"
build_serving_cache "$C" "$OUT"
if [ ! -f "$C/feat-human/.complete" ]; then
  stage "features: training prompts + the human replies"
  cache_step "$OUT/feat-human.log" "$PY" "$PIPE" features --target "$T" --source "$C/prompts.json" --split train \
    --dtype bf16 --out "$C/feat-human"
  touch "$C/feat-human/.complete"
fi

for data in regen human; do
  stage "training on $data replies ($EPOCHS epochs)"
  cache_step "$OUT/train-$data.log" "$BIN" --target-model-path "$T" --draft-model-config "$C/draft-config.json" \
    --train-hidden-states-path "$C/$([ $data = regen ] && echo feat-train || echo feat-human)" --output-dir "$OUT/run-$data" --cache-dir "$OUT/cache-$data" \
    --num-epochs "$EPOCHS" --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 \
    --warmup-ratio 0.05 --max-length 256 --ttt-length "$K" --export-dtype fp32 --save-interval 0 --log-steps 50
  ck="$(ls -d "$OUT/run-$data"/epoch_* | sort -V | tail -n 1)"
  ln -sfn "$ck" "$OUT/draft-$data"
  stage "fsdp-train metrics of the $data draft on the generated held-out sequences"
  cache_step "$OUT/eval-$data.log" "$BIN" --init-checkpoint "$ck" --eval-only --target-model-path "$T" \
    --draft-model-config "$ck/config.json" --eval-hidden-states-path "$C/feat-eval" --cache-dir "$OUT/cache-$data" \
    --max-length 512 --ttt-length "$K" --mixed-precision fp32 --draft-global-batch-size 1 \
    --draft-micro-batch-size 1 --output-dir "$OUT/eval-$data"
done
# The regenerated draft with SpecForge's config layout: vLLM reads its layer-output ids as
# hidden_states indices, one layer too low.
cache_step "$OUT/export-specforge.log" "$BIN" export --checkpoint "$(readlink "$OUT/draft-regen")" \
  --output "$OUT/draft-regen-specforge-layout" --for specforge
for d in regen human regen-specforge-layout; do
  stage "vLLM serving the $d draft (EAGLE3, k=$K)"
  cache_step "$OUT/spec-$d.log" "$VPY" "$PIPE" generate --target "$T" --prompts "$C/prompts.json" --sets eval \
    --max-tokens "$MAX_TOKENS" --draft "$OUT/draft-$d" --k "$K" --out "$OUT/spec-$d.json"
done
stage "done"

"$PY" - "$OUT" "$C/base.json" "$NUM_TRAIN" "$NUM_EVAL" "$EPOCHS" "$K" <<'PYEOF'
import json, sys
out, base_path, ntrain, neval, epochs, k = sys.argv[1:]
base = json.load(open(base_path))["outputs"]["eval"]
res = {"num_train": int(ntrain), "num_eval": int(neval), "epochs": int(epochs), "k": int(k), "drafts": {}}
for d in ["regen", "human", "regen-specforge-layout"]:
    s = json.load(open(f"{out}/spec-{d}.json"))
    same = sum(a["generated_ids"] == b["generated_ids"] for a, b in zip(base, s["outputs"]["eval"]))
    row = {"engine_accept_len": s["spec"]["mean_acceptance_length"],
           "engine_per_position": s["spec"]["acceptance_rate_per_position"],
           "drafts": s["spec"]["num_drafts"], "identical_outputs": f"{same}/{len(base)}"}
    name = d.split("-")[0]
    ev = [json.loads(l) for l in open(f"{out}/eval-{name}/metrics.jsonl") if "eval/accept_len" in l]
    if ev and d != "regen-specforge-layout":
        row["fsdp_train"] = {kk: v for kk, v in ev[-1].items() if kk.startswith("eval/") and
                             ("accept" in kk or "acc_len" in kk or kk.startswith("eval/acc_"))}
    res["drafts"][d] = row
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
print("| draft | vLLM accept len | accepted at pos 1 / 2 / 3 | fsdp-train accept_len | accept_len_all_anchors | simulated_acc_len | identical outputs |")
print("|---|---|---|---|---|---|---|")
for d, r in res["drafts"].items():
    f = r.get("fsdp_train", {})
    g = lambda key: f"{f[key]:.3f}" if key in f else "-"
    pos = " / ".join(f"{x:.3f}" for x in r["engine_per_position"])
    print(f"| {d} | {r['engine_accept_len']:.3f} | {pos} | {g('eval/accept_len')} | "
          f"{g('eval/accept_len_all_anchors')} | {g('eval/simulated_acc_len')} | {r['identical_outputs']} |")
PYEOF
