#!/usr/bin/env bash
# What --activation-checkpointing costs and saves: the same fsdp-train run (same seed, data and
# batches) with and without it; prints tokens/s, peak host RSS and (on a GPU) peak device memory
# of both, their ratios, and checks that the per-step losses and accuracies are identical.
#
# Usage: benchmarks/compare/checkpointing.sh [FSDP_TRAIN_BINARY]
# Env:   FSDP_PYTHON, DATA (default: the real SmolLM2 features of benchmarks/realdata), STEPS (8),
#        GLOBAL_BATCH (4), MICRO_BATCH (1), MAX_LENGTH (512), RANKS (1), THREADS (per rank),
#        DEVICE (cpu), PRECISION (bf16), WORK (scratch dir), EXTRA (more fsdp-train flags).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
BIN="${1:-${FSDP_TRAIN:-$REPO/build/fsdp-train}}"
DATA="${DATA:-$HOME/.cache/fsdp-train/realdata/smollm2-135m-chitchat-L512-seed0-bf16}"
RANKS="${RANKS:-1}"
THREADS="${THREADS:-$(( $(nproc) / RANKS ))}"; (( THREADS >= 1 )) || THREADS=1
WORK="${WORK:-$(mktemp -d /tmp/fsdp-ckpt.XXXXXX)}"
MPIRUN="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}"

die() { echo "checkpointing.sh: error: $*" >&2; exit 2; }
[[ -x "$PY" ]] || die "python $PY not found (set FSDP_PYTHON)"
[[ -x "$BIN" ]] || die "fsdp-train binary '$BIN' not found or not executable (build it first)"
for p in train target draft-config.json; do
  [[ -e "$DATA/$p" ]] || die "$DATA/$p missing; run benchmarks/realdata/make_features.py first"
done
mkdir -p "$WORK"
echo "== $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); data $DATA;" \
     "$RANKS rank(s) x $THREADS thread(s), device ${DEVICE:-cpu}, max length ${MAX_LENGTH:-512}"

run() {  # $1 name, then extra flags
  local name="$1"; shift
  rm -rf "$WORK/$name"   # a fresh run (fsdp-train refuses to start fresh over earlier checkpoints)
  # shellcheck disable=SC2086
  $MPIRUN -n "$RANKS" "$BIN" --target-model-path "$DATA/target" \
      --draft-model-config "$DATA/draft-config.json" --train-hidden-states-path "$DATA/train" \
      --draft-global-batch-size "${GLOBAL_BATCH:-4}" --draft-micro-batch-size "${MICRO_BATCH:-1}" \
      --max-length "${MAX_LENGTH:-512}" --ttt-length 7 --total-steps "${STEPS:-8}" \
      --num-epochs 1000 --seed 0 --learning-rate 5e-4 --max-grad-norm 0.5 --log-steps 1 \
      --mixed-precision "${PRECISION:-bf16}" --device "${DEVICE:-cpu}" --threads "$THREADS" \
      --report-to jsonl --save-interval 0 --output-dir "$WORK/$name" --cache-dir "$WORK/cache" \
      ${EXTRA:-} "$@" >"$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; die "run $name failed"; }
}
run plain
run checkpointed --activation-checkpointing

"$PY" "$HERE/metrics.py" parity "$WORK/plain/metrics.jsonl" "$WORK/checkpointed/metrics.jsonl" \
    --steps "${STEPS:-8}" --rtol 0 --atol 0 | tail -1
"$PY" - "$WORK" "$HERE" <<'PYEOF'
import json, subprocess, sys
work, here = sys.argv[1:]
p = {n: json.loads(subprocess.check_output([sys.executable, here + "/metrics.py", "perf",
                                            f"{work}/{n}/metrics.jsonl"]))
     for n in ("plain", "checkpointed")}
print("| run | tokens/s | peak RSS/rank (MiB) | peak device allocated (MiB) |")
print("|---|---|---|---|")
for n, r in p.items():
    dev = r.get("peak_device_allocated_mib")
    print(f"| {n} | {r['tokens_per_s']:.1f} | {r['peak_rss_mib_per_rank']:.0f} | "
          f"{'%.0f' % dev if dev else 'n/a (CPU)'} |")
a, b = p["plain"], p["checkpointed"]
line = (f"checkpointed/plain: tokens/s {b['tokens_per_s'] / a['tokens_per_s']:.2f}x, "
        f"peak RSS {b['peak_rss_mib_per_rank'] / a['peak_rss_mib_per_rank']:.2f}x")
if a.get("peak_device_allocated_mib") and b.get("peak_device_allocated_mib"):
    line += (f", peak device memory "
             f"{b['peak_device_allocated_mib'] / a['peak_device_allocated_mib']:.2f}x")
print(line)
PYEOF
echo "checkpointing.sh: logs and metrics in $WORK (throughput excludes the first step)"
