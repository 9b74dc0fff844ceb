# Serving tier (docs/serving.md "The serving tier"), block drafts: a DFlash draft trained by
# fsdp-train on the SmolLM2 target's own replies, served by vLLM 0.32's CPU build
# (`method: dflash`), judged by the engine's own acceptance counters; and a DSpark draft trained
# on the same sequences whose export vLLM's own DSpark model class loads (its CPU runner refuses
# to serve method dspark, docs/serving.md "The engine check").
#   bash tests/serving/dflash_acceptance.sh BUILD_DIR SOURCE_DIR
# DFlash requires (a) identical greedy fp32 outputs with and without speculation, (b) the
# engine's mean acceptance length above FLOOR, (c) fsdp-train's engine walk (eval/accept_len) on
# the very sequences vLLM generated within 3% of the engine's, every held-out row walked.
# DSpark requires that vLLM's Qwen3DSparkForCausalLM loads every parameter from the export.
set -euo pipefail
source "$2/tests/e2e/lib/common.sh"
BDV="$SRC/tests/serving/block_draft_vllm.py"
source "$SRC/benchmarks/serving/cache.sh"
serving_begin serving-dflash "$BUILD/serving_dflash"
# The serving tier's data (tests/serving/vllm_acceptance.sh): the same prompts and replies.
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64 BLOCK=4
# The floor of (b): a draft with random weights accepts nothing here (engine 1.0 over 513
# drafts, docs/serving.md); the trained draft is well above it (docs/benchmarks.md).
FLOOR=1.15

build_serving_cache "$C" "$W"
# Block-draft features of the same sequences: SpecForge's DFlash/DSpark records, the target
# layers of the EAGLE3 features ([1, 14, 26]); the DSpark ones serve DFlash too (the extra
# target_last_hidden_states key is not read by DFlash).
build_block_features "$C" "$W"

# The draft configs: the layout fsdp-train exports (block_draft_vllm.py random-export writes it
# from the target's config; its random weights are not used).
for kind in dflash dspark; do
  "$PY" "$BDV" random-export --kind $kind --target "$C/target" --out "$W/$kind-config" \
    --layers 1 --block-size $BLOCK --markov-rank 16 >"$W/$kind-config.log" 2>&1 ||
    { cat "$W/$kind-config.log"; fail "$kind draft config"; }
done

train() {  # NAME CONFIG EXTRA_FLAGS...: trains, sets CK to the final checkpoint
  local name="$1" cfg="$2"; shift 2
  stage "$name: fsdp-train training the draft"
  guarded 900 "$BIN" --target-model-path "$C/target" --draft-model-config "$cfg" \
    --train-hidden-states-path "$C/feat-dspark-train" --output-dir "$W/$name/run" \
    --cache-dir "$W/cache" --draft-global-batch-size 2 --draft-micro-batch-size 2 \
    --learning-rate 1e-3 --warmup-ratio 0.05 --max-length 256 --export-dtype fp32 \
    --save-interval 0 --log-steps 10 "$@" >"$W/$name.log" 2>&1 ||
    { tail -100 "$W/$name.log"; fail "$name: training"; }
  CK=$(latest_ckpt "$W/$name/run")
}

train dflash "$W/dflash-config/config.json" --num-epochs 4
stage "dflash: vLLM with the draft (method dflash, k = $((BLOCK - 1)))"
"$VPY" "$BDV" check --method dflash --target "$C/target" --draft "$CK" --prompts "$C/prompts.json" \
  --base "$C/base.json" --num-prompts $NUM_EVAL --max-tokens $MAX_TOKENS --work "$W/dflash/serve" \
  --check-export "$BIN" >"$W/dflash-serve.log" 2>&1 ||
  { tail -40 "$W/dflash-serve.log"; fail "dflash: the engine check"; }

stage "dflash: fsdp-train's engine walk on the same sequences"
guarded 600 "$BIN" --init-checkpoint "$CK" --eval-only --target-model-path "$C/target" \
  --draft-model-config "$CK/config.json" --eval-hidden-states-path "$C/feat-dspark-eval" \
  --cache-dir "$W/cache" --max-length 512 --mixed-precision fp32 --num-anchors 512 \
  --draft-global-batch-size 1 --draft-micro-batch-size 1 --output-dir "$W/dflash/eval" \
  >"$W/dflash-eval.log" 2>&1 || { tail -100 "$W/dflash-eval.log"; fail "dflash: eval-only"; }

"$PY" - "$W/dflash/serve/report.json" "$W/dflash/eval/metrics.jsonl" "$FLOOR" <<'PYEOF' ||
import json, sys
r = json.load(open(sys.argv[1]))
n_same, n = map(int, r["identical_outputs"].split("/"))
assert n_same == n > 0, f"(a) outputs differ: {r['identical_outputs']} identical"
engine, floor = r["mean_acceptance_length"], float(sys.argv[3])
assert engine is not None and engine > floor, f"(b) engine acceptance {engine} <= {floor}"
ev = [json.loads(l) for l in open(sys.argv[2]) if "eval/accept_len" in l][-1]
ours = ev["eval/accept_len"]
assert ev["eval/rows_not_walked"] == 0, f"{ev['eval/rows_not_walked']} held-out rows not walked"
rel = abs(ours - engine) / engine
print(json.dumps({"draft": "dflash", "identical_outputs": r["identical_outputs"],
                  "engine_accept_len": round(engine, 4), "engine_drafts": r["num_drafts"],
                  "engine_per_position": r["acceptance_rate_per_position"],
                  "fsdp_train_accept_len": round(ours, 4), "relative_difference": round(rel, 4),
                  "fsdp_train_eval_acc": round(ev["eval/acc"], 4)}))
assert rel <= 0.03, f"(c) fsdp-train accept_len {ours} vs engine {engine}: {rel:.2%} apart"
PYEOF
  fail "dflash: serving checks"

train dspark "$W/dspark-config/config.json" --num-epochs 1
stage "dspark: vLLM's DSpark model class loads the trained export"
"$VPY" "$BDV" load-check --method dspark --target "$C/target" --draft "$CK" \
  --check-export "$BIN" >"$W/dspark-load.log" 2>&1 ||
  { tail -40 "$W/dspark-load.log"; fail "dspark: vLLM's loader on the trained export"; }
grep '"parameters_loaded"' "$W/dspark-load.log"
stage "done"
