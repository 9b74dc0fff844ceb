#!/usr/bin/env bash
# Streaming against offline training (docs/benchmarks.md "Streaming"), on the serving tier's
# cached SmolLM2-135M features (48 training sequences: prompts + the target's own replies):
#  1. quality: an offline run (shuffled by --seed) and a stream fed by a producer in the offline
#     sampler's order: the exports' hashes, held-out loss/accuracy/accept_len, and vLLM's
#     acceptance serving each draft (k = 3, the 12 held-out prompts);
#  2. disk: fsdp-train's own feature builder (pipeline.py features --spool, the target running
#     beside the trainer) filling a spool under a budget of BUDGET_SAMPLES samples: the spool's
#     peak (sampled every 5 ms) against the offline dump of the same samples;
#  3. the trainer's data-wait share (perf/data_share over the run) with a producer faster than
#     the trainer (a replay of the dump, unpaced) and slower (one sample every SLOW_S seconds).
# Results: $OUT/results.json and a Markdown table on stdout.
#   bash benchmarks/streaming/bench.sh [BUILD_DIR]   (after launch/setup.sh and
#   launch/setup-serving.sh; BUDGET_SAMPLES, SLOW_S, OUT override the defaults; SERVE=0 skips vLLM)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SPOOL_PY="$REPO/apps/spool/fsdp_spool.py"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64  # the serving tier's cache
BUDGET_SAMPLES="${BUDGET_SAMPLES:-8}" SLOW_S="${SLOW_S:-0.5}" SERVE="${SERVE:-1}"
source "$REPO/benchmarks/serving/cache.sh"
bench_tools "${1:-}"
require_serving_tools
C="$(serving_cache_dir)"
OUT="${OUT:-$BUILD/streaming_bench}"
rm -rf "$OUT"
mkdir -p "$C" "$OUT"
t0=$(date +%s)
stage() { echo "[streaming] $(( $(date +%s) - t0 ))s: $*"; }
build_serving_cache "$C" "$OUT"
N=$(find "$C/feat-train" -name '*.ckpt' | wc -l)
STEPS=$((N / 4))
ARGS="--target-model-path $C/target --draft-model-config $C/draft-config.json
  --eval-hidden-states-path $C/feat-eval --cache-dir $OUT/cache --num-epochs 1 --total-steps $STEPS
  --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 --warmup-ratio 0.05
  --max-length 256 --ttt-length 3 --save-interval 1 --eval-interval 1 --export-dtype fp32
  --log-steps 1 --seed 0 --device cpu"


stage "1. offline run on $N samples ($STEPS steps)"
cache_step "$OUT/offline.log" "$BIN" $ARGS --train-hidden-states-path "$C/feat-train" \
  --output-dir "$OUT/offline"
"$PY" -c "import torch, json; g = torch.Generator(); g.manual_seed(0); print(json.dumps(torch.randperm($N, generator=g).tolist()))" >"$OUT/order.json"
"$PY" - "$(ls -d "$OUT"/offline/epoch_*_step_* | sort -V | tail -n 1)" "$OUT/vocab.pt" <<'PYEOF'
import sys, torch
from safetensors.torch import load_file
t = load_file(sys.argv[1] + "/model.safetensors")
torch.save({"d2t": t["d2t"], "t2d": t["t2d"]}, sys.argv[2])
PYEOF
# stream NAME PRODUCER...: a streaming run beside a producer (its command), spool peak monitored.
stream() {
  local name="$1"; shift
  mkdir -p "$OUT/spool-$name"
  "$PY" "$SPOOL_PY" watch "$OUT/spool-$name" --out "$OUT/peak-$name" --every 0.005 &
  local mon=$!
  "$@" >"$OUT/producer-$name.log" 2>&1 &
  local prod=$!
  cache_step "$OUT/stream-$name.log" "$BIN" $ARGS --train-hidden-states-path "$OUT/spool-$name" \
    --stream --stream-start-samples 4 --vocab-mapping-path "$OUT/vocab.pt" \
    --output-dir "$OUT/stream-$name" ${STREAM_EXTRA:-}
  wait $prod || { tail -20 "$OUT/producer-$name.log"; echo "FAIL: producer $name"; exit 1; }
  touch "$OUT/spool-$name/.spool/done"
  wait $mon
}
stage "1. the same samples streamed in the offline order"
stream order "$PY" "$SPOOL_PY" replay --source "$C/feat-train" --spool "$OUT/spool-order" \
  --order "$OUT/order.json" --end
largest=$(find "$C/feat-train" -name '*.ckpt' -printf '%s\n' | sort -n | tail -n 1)
budget_gb=$("$PY" -c "print($BUDGET_SAMPLES * $largest / 2**30)")
stage "2. fsdp-train's feature builder into a spool of $BUDGET_SAMPLES samples' budget"
STREAM_EXTRA="--stream-max-gb $budget_gb --keep-last 2" stream builder "$PY" "$PIPE" features \
  --target "$C/target" --source "$C/base.json" --split train --dtype bf16 \
  --spool "$OUT/spool-builder" --end
stage "3. producer faster (replay, unpaced) and slower (one sample per $SLOW_S s)"
STREAM_EXTRA="--stream-max-gb $budget_gb --keep-last 2" stream fast "$PY" "$SPOOL_PY" replay \
  --source "$C/feat-train" --spool "$OUT/spool-fast" --end
STREAM_EXTRA="--stream-max-gb $budget_gb --keep-last 2" stream slow "$PY" "$SPOOL_PY" replay \
  --source "$C/feat-train" --spool "$OUT/spool-slow" --every "$SLOW_S" --end

if [ "$SERVE" = 1 ]; then
  for name in offline stream-order; do
    stage "vLLM serving the $name draft"
    ck="$(ls -d "$OUT/$name"/epoch_*_step_* | sort -V | tail -n 1)"
    cache_step "$OUT/serve-$name.log" "$VPY" "$PIPE" generate --target "$C/target" \
      --prompts "$C/prompts.json" --sets eval --draft "$ck" --k 3 --max-tokens "$MAX_TOKENS" \
      --out "$OUT/serve-$name.json"
  done
fi

"$PY" - "$OUT" "$C/feat-train" "$BUDGET_SAMPLES" "$largest" "$SLOW_S" <<'PYEOF'
import glob, hashlib, json, os, sys
out, dump, budget_samples, largest, slow = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def latest(d):
    return sorted(glob.glob(f"{out}/{d}/epoch_*_step_*"), key=lambda p: int(p.rsplit("_", 1)[1]))[-1]
def sha(d):
    return hashlib.sha256(open(latest(d) + "/model.safetensors", "rb").read()).hexdigest()[:16]
def metrics(d):
    rows = [json.loads(l) for l in open(f"{out}/{d}/metrics.jsonl")]
    train = [r for r in rows if "perf/data_share" in r]
    ev = [r for r in rows if "eval/loss" in r][-1]
    return train, ev
dump_bytes = sum(os.path.getsize(p) for p in glob.glob(f"{dump}/**/*.ckpt", recursive=True))
res = {"samples": len(glob.glob(f"{dump}/**/*.ckpt", recursive=True)), "offline_dump_bytes": dump_bytes,
       "budget_bytes": budget_samples * largest, "runs": {}}
for name in ["offline", "stream-order", "stream-builder", "stream-fast", "stream-slow"]:
    train, ev = metrics(name)
    r = {"export_sha256_16": sha(name), "eval": {k: ev[k] for k in ev if k.startswith("eval/")},
         "data_share_mean": sum(t["perf/data_share"] for t in train) / len(train),
         "steps": len(train)}
    peak = f"{out}/peak-{name.replace('stream-', '')}"
    if name != "offline" and os.path.exists(peak):
        r["spool_peak_bytes"] = int(open(peak).read())
    serve = f"{out}/serve-{name}.json"
    if os.path.exists(serve):
        r["vllm_mean_acceptance_length"] = json.load(open(serve))["spec"]["mean_acceptance_length"]
    res["runs"][name] = r
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
print(f"| run | export sha256 | eval loss | eval acc_0 | accept_len | data share | spool peak / dump | vLLM accept len |")
print("|---|---|---|---|---|---|---|---|")
for name, r in res["runs"].items():
    e = r["eval"]
    peak = f"{r['spool_peak_bytes'] / dump_bytes:.3f}" if "spool_peak_bytes" in r else "-"
    acc = e.get("eval/acc_0", e.get("eval/acc", float("nan")))
    v = r.get("vllm_mean_acceptance_length")
    print(f"| {name} | {r['export_sha256_16']} | {e['eval/loss']:.5f} | {acc:.4f} | "
          f"{e.get('eval/accept_len', float('nan')):.4f} | {r['data_share_mean']:.3f} | {peak} | "
          f"{'-' if v is None else f'{v:.4f}'} |")
print(f"offline dump {dump_bytes} bytes ({res['samples']} samples); budget {res['budget_bytes']} bytes "
      f"({budget_samples} x the largest sample); slow producer: one sample per {slow} s")
PYEOF
stage "done: $OUT/results.json"
