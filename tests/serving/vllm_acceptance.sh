# Serving tier (docs/serving.md "The serving tier"): a draft trained by fsdp-train, served by a
# real engine (vLLM 0.32's CPU build), judged by the engine's own acceptance counters.
#   bash tests/serving/vllm_acceptance.sh BUILD_DIR SOURCE_DIR
# Requires (a) identical greedy fp32 outputs with and without speculation, (b) the engine's mean
# acceptance length above FLOOR, (c) fsdp-train's engine-faithful eval/accept_len on the very
# sequences vLLM generated within 2% of the engine's; for the plain EAGLE3 draft and for a draft
# variant (EAGLE3.1's fc_norm and norm_output with two decoder layers, docs/model.md "Draft
# variants"), for a draft of Qwen3 layers (Eagle3Qwen3ForCausalLM, q_norm/k_norm), and for a
# P-EAGLE draft served with vLLM's parallel drafting (docs/model.md "P-EAGLE"): (c) holds
# only if vLLM computes the variant as fsdp-train trained it. Data, target and the baseline generation are
# cached under ~/.cache/fsdp-train/serving/<key> (key: the pipeline's sources); training, export
# and speculative serving run every time.
set -euo pipefail
source "$2/tests/e2e/lib/common.sh"
source "$SRC/benchmarks/serving/cache.sh"
serving_begin serving "$BUILD/serving_tier"
# Sizes: 12 held-out prompts x 64 tokens give about 400 drafts (k = 3), enough that the 2% bound
# is not noise; 48 training prompts train a draft well above chance in a few minutes.
NUM_TRAIN=48 NUM_EVAL=12 K=3 MAX_TOKENS=64
# The floor of (b): a draft that reads the wrong target layers, or lacks d2t, accepts about
# nothing on these prompts (the engine then reports 1.0-1.15: docs/benchmarks.md); a trained
# draft on the target's own replies is well above it.
FLOOR=1.25

build_serving_cache "$C" "$W"

# The variant's draft config: the serving draft's with EAGLE3.1's keys and a second layer; and
# the serving draft's with Qwen3 layers (q_norm/k_norm; vLLM's qwen3_eagle3 model), its head_dim
# written (Qwen3Config's default is 128, SmolLM2's heads are 64 wide).
"$PY" - "$C/draft-config.json" "$W/variant-config.json" "$W/qwen3-config.json" \
  "$W/peagle-config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
v = dict(c, fc_norm=True, norm_output=True, num_hidden_layers=2)
json.dump(v, open(sys.argv[2], "w"), indent=1)
q = dict(c, architectures=["Eagle3Qwen3ForCausalLM"], model_type="qwen3",
         head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]))
json.dump(q, open(sys.argv[3], "w"), indent=1)
# P-EAGLE (parallel drafting): the serving draft's with SpecForge's architecture and a mask token
# (SmolLM2 has none: the last id, which its replies never use).
p = dict(c, architectures=["PEagleDraftModel"], mask_token_id=c["vocab_size"] - 1)
json.dump(p, open(sys.argv[4], "w"), indent=1)
PYEOF

# serve_and_check NAME DRAFT_CONFIG EXTRA_FLAGS...: train, export, serve with vLLM, evaluate
# with fsdp-train on the sequences vLLM generated, and check (a)-(d). A P-EAGLE draft (PEAGLE=1)
# is served with parallel drafting, trained and evaluated over K depths and evaluated with its
# own config (its export's config.json is the EAGLE3 one vLLM reads).
serve_and_check() {
  local name="$1" dcfg="$2"; shift 2
  local steps="--ttt-length $K" gen="" eval_cfg=""
  [ "${PEAGLE:-0}" = 1 ] && { steps="--num-depths $K"; gen="--parallel-drafting"; eval_cfg="$dcfg"; }
  local R="$W/$name"
  mkdir -p "$R"
  stage "$name: fsdp-train training the draft"
  guarded 900 "$BIN" --target-model-path "$C/target" --draft-model-config "$dcfg" \
    --train-hidden-states-path "$C/feat-train" --output-dir "$R/run" --cache-dir "$W/cache" \
    --num-epochs 6 --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 \
    --warmup-ratio 0.05 --max-length 256 $steps --export-dtype fp32 --save-interval 0 \
    --log-steps 10 "$@" >"$R/train.log" 2>&1 || { tail -100 "$R/train.log"; fail "$name: training"; }
  CK="$(ls -d "$R/run"/epoch_* | sort -V | tail -n 1)"
  "$BIN" check-export "$CK" --for vllm --target-model-path "$C/target" >"$R/check.log" 2>&1 ||
    { cat "$R/check.log"; fail "$name: check-export on the trained draft"; }

  stage "$name: vLLM with the draft (EAGLE3, k=$K)"
  "$VPY" "$PIPE" generate --target "$C/target" --prompts "$C/prompts.json" --sets eval \
    --max-tokens $MAX_TOKENS --draft "$CK" --k $K $gen --out "$R/spec.json" >"$R/spec.log" 2>&1 ||
    { tail -30 "$R/spec.log"; fail "$name: speculative generation"; }

  stage "$name: fsdp-train engine-faithful accept_len on the same sequences"
  guarded 600 "$BIN" --init-checkpoint "$CK" --eval-only --target-model-path "$C/target" \
    --draft-model-config "${eval_cfg:-$CK/config.json}" --eval-hidden-states-path "$C/feat-eval" \
    --cache-dir "$W/cache" --max-length 512 $steps --mixed-precision fp32 \
    --draft-global-batch-size 1 --draft-micro-batch-size 1 --output-dir "$R/eval" "$@" \
    >"$R/eval.log" 2>&1 || { tail -100 "$R/eval.log"; fail "$name: eval-only"; }

  "$PY" - "$C/base.json" "$R/spec.json" "$R/eval/metrics.jsonl" "$FLOOR" "$R/spec.log" "$CK/aux_layers.json" "$name" <<'PYEOF' || fail "$name: serving checks"
import json, re, sys
# The layers vLLM captured, as its own code computed them from our config.json (its log line),
# are the ones the features hold.
m = re.findall(r"Using (?:Eagle3 )?auxiliary layers from (?:speculative )?config: \(([0-9, ]+)\)",
               open(sys.argv[5]).read())
want = json.load(open(sys.argv[6]))["hidden_state_index"]
assert m and [int(x) for x in m[-1].split(",")] == want, f"vLLM captured {m} but the features hold {want}"
base = json.load(open(sys.argv[1]))["outputs"]["eval"]
spec_run = json.load(open(sys.argv[2]))
spec = spec_run["outputs"]["eval"]
same = sum(a["generated_ids"] == b["generated_ids"] for a, b in zip(base, spec))
assert len(base) == len(spec) and same == len(base), f"(a) outputs differ: {same}/{len(base)} identical"
s = spec_run["spec"]
engine = s["mean_acceptance_length"]
floor = float(sys.argv[4])
assert engine is not None and engine > floor, f"(b) engine acceptance {engine} <= {floor}"
ev = [json.loads(l) for l in open(sys.argv[3]) if "eval/accept_len" in l][-1]
ours = ev["eval/accept_len"]
rel = abs(ours - engine) / engine
print(json.dumps({"draft": sys.argv[7], "identical_outputs": f"{same}/{len(base)}", "engine_accept_len": round(engine, 4),
                  "engine_drafts": s["num_drafts"], "engine_per_position": s["acceptance_rate_per_position"],
                  "fsdp_train_accept_len": round(ours, 4), "relative_difference": round(rel, 4),
                  "fsdp_train_other": {k: round(v, 4) for k, v in ev.items()
                                       if k.startswith("eval/") and ("accept" in k or "acc_len" in k)}}))
assert rel <= 0.02, f"(c) fsdp-train accept_len {ours} vs engine {engine}: {rel:.2%} apart"
PYEOF
}

serve_and_check eagle3 "$C/draft-config.json"
serve_and_check eagle31-2layer "$W/variant-config.json" --export-for vllm
serve_and_check eagle3-qwen3-layers "$W/qwen3-config.json" --export-for vllm
PEAGLE=1 serve_and_check peagle "$W/peagle-config.json"
stage "done"
