# Serving tier (docs/data.md "Streaming", docs/serving.md "vLLM as the producer"): vLLM 0.32's CPU
# build is the producer of a streaming run. It generates the SmolLM2 target's greedy replies to the
# first 24 training prompts with its extract_hidden_states method (benchmarks/streaming/vllm_producer.py,
# --mode prefill: every token captured) and publishes each request's sample into a spool under a
# budget of 8 samples while fsdp-train trains from it. Requires:
#  (a) the run ends at vLLM's END_OF_STREAM with every sample trained once and deleted (ledger:
#      24 arrivals, acknowledged), the spool never above its budget;
#  (b) the samples are the target's features: the same sequences from the transformers feature
#      builder (the serving cache's feat-train), replayed in vLLM's arrival order into a second
#      stream, train per-step losses within 1e-2 relative (the features differ by bf16 rounding
#      of two engines' fp32 arithmetic).
#   bash tests/serving/stream_vllm.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$2/tests/e2e/lib/common.sh"
source "$SRC/benchmarks/serving/cache.sh"
serving_begin serving-stream "$BUILD/serving_stream"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64
build_serving_cache "$C" "$W"
SPOOL_PY="$SRC/apps/spool/fsdp_spool.py"
N=24  # prompts vLLM runs (of the cache's 48): 6 steps of 4
largest=$(find "$C/feat-train" -name '*.ckpt' -printf '%s\n' | sort -n | tail -n 1)
budget=$((8 * largest))
budget_gb=$("$PY" -c "print($budget / 2**30)")

# train SPOOL OUT: a stream of N samples, 4 per step, in the background (PID in TRAINER).
train() {
  guarded 900 "$BIN" --target-model-path "$C/target" --draft-model-config "$C/draft-config.json" \
    --train-hidden-states-path "$1" --stream --stream-max-gb "$budget_gb" --stream-start-samples 4 \
    --output-dir "$2" --cache-dir "$W/cache" --total-steps $((N / 4)) --num-epochs 1 \
    --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 \
    --warmup-ratio 0.05 --max-length 256 --ttt-length 3 --export-dtype fp32 --save-interval 0 \
    --keep-last 2 --log-steps 1 --seed 0 "${@:3}" >"$2.log" 2>&1 &
  TRAINER=$!
}

mkdir -p "$W/spool-vllm"
stage "fsdp-train --stream beside vLLM (extract_hidden_states) producing $N samples"
"$PY" "$SPOOL_PY" watch "$W/spool-vllm" --out "$W/peak" --every 0.005 &  # the spool's peak size
MONITOR=$!
train "$W/spool-vllm" "$W/run-vllm"
"$VPY" "$SRC/benchmarks/streaming/vllm_producer.py" --target "$C/target" --prompts "$C/prompts.json" \
  --split train --limit $N --spool "$W/spool-vllm" --mode prefill --max-tokens "$MAX_TOKENS" --max-num-seqs 4 \
  --end >"$W/producer.log" 2>&1 || { tail -40 "$W/producer.log"; fail "the vLLM producer"; }
wait $TRAINER || { tail -60 "$W/run-vllm.log"; fail "training from vLLM's stream"; }
touch "$W/spool-vllm/.spool/done"
wait $MONITOR
peak=$(cat "$W/peak")
[ "$peak" -le "$budget" ] || fail "the spool held $peak bytes, over its budget of $budget"

# (b) the transformers features of the same sequences, in vLLM's arrival order.
"$PY" - "$W/spool-vllm" "$C/feat-train" "$W/order.json" "$N" <<'PYEOF' || fail "the vLLM stream's ledger"
import json, os, re, sys
spool, feat, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lines = open(os.path.join(spool, ".spool", "ledger")).read().splitlines()
names = [l.split()[1] for l in lines if l.startswith("A ")]
assert len(names) == n and f"E {n}" in lines and lines[-1] == f"K {n}", (len(names), lines[-3:])
assert not [f for f in os.listdir(spool) if f.endswith(".ckpt")], "samples left in the spool"
files = sorted((os.path.join(r, f) for r, _, fs in os.walk(feat) for f in fs if f.endswith(".ckpt")))
index = {re.search(r"data_(\d+)\.ckpt$", p).group(1).lstrip("0") or "0": k for k, p in enumerate(files)}
order = [index[re.search(r"data_(\d+)\.ckpt$", m).group(1).lstrip("0") or "0"] for m in names]
json.dump(order, open(out, "w"))
PYEOF
mkdir -p "$W/spool-hf"
stage "the same sequences from the transformers feature builder, in vLLM's order"
train "$W/spool-hf" "$W/run-hf"
"$PY" "$SPOOL_PY" replay --source "$C/feat-train" --spool "$W/spool-hf" --order "$W/order.json" \
  --end >"$W/replay.log" 2>&1 || { cat "$W/replay.log"; fail "replay"; }
wait $TRAINER || { tail -60 "$W/run-hf.log"; fail "training from the replayed stream"; }
"$PY" - "$W/run-vllm/metrics.jsonl" "$W/run-hf/metrics.jsonl" "$N" <<'PYEOF' || fail "vLLM's features against the transformers features"
import json, sys
a, b = ([r["train/loss"] for r in map(json.loads, open(p)) if "train/loss" in r] for p in sys.argv[1:3])
steps = int(sys.argv[3]) // 4
assert len(a) == len(b) == steps, (len(a), len(b), steps)
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
assert worst < 1e-2, ("per-step losses", worst)
assert sum(a[-2:]) < sum(a[:2]), a
print(f"vLLM-fed stream: {steps} steps, loss {sum(a[:2]) / 2:.3f} -> {sum(a[-2:]) / 2:.3f}; "
      f"per-step losses within {worst:.1e} of the transformers-fed stream")
PYEOF
stage "done: spool peak $peak of $budget bytes; $(grep -c 'to acknowledge' "$W/run-vllm.log") budget checkpoints"
