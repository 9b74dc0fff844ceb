#!/usr/bin/env bash
# Peak host memory of one training step against the sample length (docs/benchmarks.md "Memory
# against sequence length"): toy features of one length S per run (target H 64, V 32768, draft
# Vd 32000, so the draft head's [rows, Vd] logits dominate as they do for real drafts), TTT 7,
# micro-batch 1, fp32, one rank on the CPU, with the unchunked head (--head-chunk-rows -1) and a
# chunked one (--head-chunk-rows 1024); peak RSS from the run's metrics (mem/host_peak_rss_gib)
# and the bytes per token above the shortest run's. A run the start-up memory check refuses
# (exit code 2: it would not fit this machine) is reported as such.
#   bash benchmarks/memory/seq_len.sh [BUILD_DIR]      LENGTHS (default "1024 2048 4096 8192 16384");
#   the unchunked head only up to UNCHUNKED_MAX (default 8192: 16384 needs about 23 GiB).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$REPO/build}"
BIN="$BUILD/fsdp-train"
PY="${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}/bin/python"
OUT="${OUT:-$BUILD/seq_len_bench}" LENGTHS="${LENGTHS:-1024 2048 4096 8192 16384}"
UNCHUNKED_MAX="${UNCHUNKED_MAX:-8192}"
rm -rf "$OUT"; mkdir -p "$OUT"
for S in $LENGTHS; do
  "$BIN" gen-toy-data --out "$OUT/data-$S" --num-samples 2 --min-len "$S" --max-len "$S" \
    --vocab-size 32768 --draft-vocab-size 32000 --samples-per-dir 2 >/dev/null
  for head in -1 1024; do
    [ "$head" -eq -1 ] && [ "$S" -gt "$UNCHUNKED_MAX" ] && continue
    echo "[seq-len] S $S, --head-chunk-rows $head"
    "$BIN" --target-model-path "$OUT/data-$S/target" \
      --draft-model-config "$OUT/data-$S/draft_config.json" \
      --train-hidden-states-path "$OUT/data-$S/hidden_states" --cache-dir "$OUT/cache" \
      --output-dir "$OUT/run-$S-$head" --max-length "$S" --ttt-length 7 \
      --draft-global-batch-size 1 --draft-micro-batch-size 1 --max-steps 1 --log-steps 1 \
      --mixed-precision fp32 --head-chunk-rows "$head" --save-final false --save-interval 0 \
      --device cpu --threads 1 >"$OUT/run-$S-$head.log" 2>&1 && rc=0 || rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 2 ] || { tail -20 "$OUT/run-$S-$head.log"; exit 1; }
  done
done
"$PY" - "$OUT" $LENGTHS <<'PYEOF'
import json, sys
out, lengths = sys.argv[1], [int(s) for s in sys.argv[2:]]
def peak(s, head):
    try:
        rows = [json.loads(l) for l in open(f"{out}/run-{s}-{head}/metrics.jsonl")]
    except FileNotFoundError:
        return None  # not run, or refused by the start-up memory check
    return max(r["mem/host_peak_rss_gib"] for r in rows if "mem/host_peak_rss_gib" in r) * 1024
print("| S | unchunked head: peak RSS MiB | KiB per token above S0 | chunked head (1024 rows): peak RSS MiB | KiB per token above S0 |")
print("|---|---|---|---|---|")
s0 = lengths[0]
for s in lengths:
    cells = []
    for head in (-1, 1024):
        p, p0 = peak(s, head), peak(s0, head)
        if p is None:
            cells += ["not run / refused (would not fit)", ""]
            continue
        cells += [f"{p:.0f}", "" if s == s0 or p0 is None else f"{(p - p0) * 1024 / (s - s0):.1f}"]
    print(f"| {s} | " + " | ".join(cells) + " |")
PYEOF
