#!/usr/bin/env bash
# Block drafts, fsdp-train against SpecForge 0.2.0's own modules (docs/benchmarks.md "DFlash and
# DSpark against SpecForge's modules"): the same draft config, initial weights, samples and
# order, optimizer, schedule and clipping, trained for STEPS steps at each rank count of RANKS on
# the CPU. The reference is benchmarks/reference/block_draft_train.py (SpecForge's DFlash/DSpark
# modules, SDPA attention, sharded as SpecForge shards them by default); fsdp-train runs with
# --sharding-strategy shard_grad_op, its equivalent. Reports steady tokens/s (the first step is
# warm-up), peak RSS per rank, the ratio fsdp-train/reference and how far the two trainers'
# per-step losses are apart (the results must be equal for the speed to count). Every number
# printed comes from the runs.
#   bash benchmarks/compare/block_drafts.sh [BUILD_DIR]   (after launch/setup.sh, setup-serving.sh)
# Env: KINDS ("dflash dspark"), RANKS ("1 2"), STEPS (6), GLOBAL_BATCH (4: one micro-batch per
#      rank and step, so at 1 rank both trainers normalise the loss identically), BLOCK (16,
#      SpecForge's default), LAYERS (1), NUM_ANCHORS (512), OUT (BUILD/block_drafts_bench).
# Data: the serving tier's SmolLM2-135M features of the target's own replies (48 samples, 41-162
# tokens; target layers [1, 14, 26]), built into the serving cache on first use.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$REPO/build}"
BIN="$BUILD/fsdp-train"
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
VPY="${FSDP_VLLM_VENV:-$HOME/.cache/fsdp-train/vllm-venv}/bin/python"
TORCHRUN="$(dirname "$PY")/torchrun"
SRC="$REPO" PIPE="$REPO/benchmarks/serving/pipeline.py"
NUM_TRAIN=48 NUM_EVAL=12 MAX_TOKENS=64
KINDS="${KINDS:-dflash dspark}" RANKS="${RANKS:-1 2}" STEPS="${STEPS:-6}"
GB="${GLOBAL_BATCH:-4}" BLOCK="${BLOCK:-16}" LAYERS="${LAYERS:-1}" ANCHORS="${NUM_ANCHORS:-512}"
OUT="${OUT:-$BUILD/block_drafts_bench}"
MPIRUN="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}"
CORES=$(nproc)
source "$REPO/benchmarks/serving/cache.sh"
require_serving_tools
"$PY" -c 'import specforge' 2>/dev/null ||
  { echo "error: specforge is not installed in $PY's environment"; echo "---> HINT: bash launch/setup.sh"; exit 2; }
stage() { echo "[block-bench] $*"; }
C="$(serving_cache_dir)"
rm -rf "$OUT"; mkdir -p "$OUT" "$C"
build_serving_cache "$C" "$OUT"
build_block_features "$C" "$OUT"

for kind in $KINDS; do
  "$PY" "$REPO/tests/serving/block_draft_vllm.py" random-export --kind "$kind" --target "$C/target" \
    --out "$OUT/$kind-config" --layers "$LAYERS" --block-size "$BLOCK" --markov-rank 16 \
    >"$OUT/$kind-config.log" 2>&1 || { tail -20 "$OUT/$kind-config.log"; exit 1; }
  cfg="$OUT/$kind-config/config.json"
  for np in $RANKS; do
    (( GB % np == 0 )) || { echo "error: GLOBAL_BATCH $GB is not a multiple of $np ranks"; exit 2; }
    micro=$(( GB / np )) threads=$(( CORES / np > 0 ? CORES / np : 1 ))
    common=(--target-model-path "$C/target" --draft-model-config "$cfg"
            --train-hidden-states-path "$C/feat-dspark-train" --draft-global-batch-size "$GB"
            --draft-micro-batch-size "$micro" --learning-rate 1e-3 --warmup-ratio 0
            --max-length 512 --num-anchors "$ANCHORS" --max-grad-norm 0.5)
    init=()
    [ -f "$OUT/$kind-init/model.safetensors" ] || init=(--save-init "$OUT/$kind-init")
    stage "$kind, $np rank(s): SpecForge's modules"
    "$TORCHRUN" --standalone --nproc-per-node "$np" "$REPO/benchmarks/reference/block_draft_train.py" \
      "${common[@]}" --total-steps "$STEPS" --threads "$threads" --output-dir "$OUT/$kind-ref-$np" \
      "${init[@]}" >"$OUT/$kind-ref-$np.log" 2>&1 || { tail -30 "$OUT/$kind-ref-$np.log"; exit 1; }
    stage "$kind, $np rank(s): fsdp-train"
    $MPIRUN -n "$np" "$BIN" "${common[@]}" --init-checkpoint "$OUT/$kind-init" \
      --total-steps "$STEPS" --max-steps "$STEPS" --mixed-precision fp32 --threads "$threads" \
      --sharding-strategy shard_grad_op --save-interval 0 --log-steps 1 --report-to jsonl \
      --output-dir "$OUT/$kind-fsdp-$np" >"$OUT/$kind-fsdp-$np.log" 2>&1 ||
      { tail -30 "$OUT/$kind-fsdp-$np.log"; exit 1; }
  done
done

"$PY" - "$OUT" "$KINDS" "$RANKS" <<'PYEOF'
import json, os, sys
out, kinds, ranks = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()


def steps(path):
    recs = {}
    for line in open(path):
        r = json.loads(line)
        if isinstance(r.get("step"), int) and "train/loss" in r:
            recs[r["step"]] = r
    return [recs[s] for s in sorted(recs)]


def perf(recs):
    steady = recs[1:]  # the first step is warm-up
    if not steady:
        sys.exit("error: fewer than 2 logged steps")
    secs = sum(r.get("perf/step_s", r.get("perf/step_time_s")) for r in steady)
    tokens = sum(r["perf/tokens"] if "perf/tokens" in r else
                 r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in steady)
    rss = 0.0
    for r in recs:
        m = r.get("mem/peak_rss_mib")
        rss = max(rss, max(m) if isinstance(m, list) else r.get("mem/host_peak_rss_gib", 0) * 1024)
    return tokens / secs, rss


rows, summary = [], []
for kind in kinds:
    for np_ in ranks:
        ref = steps(os.path.join(out, f"{kind}-ref-{np_}", "metrics.jsonl"))
        ours = steps(os.path.join(out, f"{kind}-fsdp-{np_}", "metrics.jsonl"))
        if len(ref) != len(ours):
            sys.exit(f"error: {kind} at {np_} ranks: {len(ref)} reference steps, {len(ours)} ours")
        (rt, rr), (ot, orss) = perf(ref), perf(ours)
        rel = [abs(a["train/loss"] - b["train/loss"]) / abs(a["train/loss"]) for a, b in zip(ref, ours)]
        rows.append(f"| {kind} | {np_} | {rt:.1f} | {ot:.1f} | {ot / rt:.2f}x | {rr:.0f} | {orss:.0f} | "
                    f"{rel[0]:.1e} | {max(rel):.1e} |")
        summary.append({"kind": kind, "ranks": int(np_), "reference_tokens_per_s": rt,
                        "fsdp_train_tokens_per_s": ot, "ratio": ot / rt,
                        "reference_peak_rss_mib": rr, "fsdp_train_peak_rss_mib": orss,
                        "step1_loss_rel_diff": rel[0], "max_loss_rel_diff": max(rel),
                        "reference_losses": [r["train/loss"] for r in ref],
                        "fsdp_train_losses": [r["train/loss"] for r in ours]})
print("| draft | ranks | SpecForge modules tokens/s | fsdp-train tokens/s | ratio | "
      "SpecForge peak RSS MiB/rank | fsdp-train peak RSS MiB/rank | step-1 loss rel. diff | "
      "max loss rel. diff |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
PYEOF
