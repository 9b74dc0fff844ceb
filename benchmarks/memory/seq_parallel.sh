#!/usr/bin/env bash
# Peak host memory per rank of one training step against the sample length, with sequence
# parallelism (docs/benchmarks.md "Sequence parallelism: memory and exactness"): toy features of
# one length S per run (target H 64, V 32768, draft Vd 32000; the draft given 4 attention and 4
# key/value heads of 16 so that groups of 2 and 4 can split them), TTT 7, micro-batch 1, fp32,
# read from native shards, on the CPU, one thread per rank, at --sp-ulysses-size 1, 2 and 4 (as
# many ranks), with the chunked head (--head-chunk-rows 1024) and, up to UNCHUNKED_MAX, the
# unchunked one. Reports the largest peak RSS of the ranks (GNU time's maximum resident set; the
# rank that peaks is the one whose slice holds the most loss rows), the bytes per token above
# the shortest run's, the KiB rank 0 read (perf/read_mib_per_step), and how far each
# sequence-parallel run's logged metrics (losses, accuracies, acceptance, gradient norm) are
# from the run without it (worst relative difference): the same step, split.
#   bash benchmarks/memory/seq_parallel.sh [BUILD_DIR]
#   LENGTHS (default "2048 4096 8192 16384 32768"), SPS (default "1 2 4"), UNCHUNKED_MAX (4096).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$REPO/build}"
BIN="$BUILD/fsdp-train"
PY="${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}/bin/python"
MPIEXEC="${MPIEXEC:-mpiexec}"
OUT="${OUT:-$BUILD/seq_parallel_bench}" LENGTHS="${LENGTHS:-2048 4096 8192 16384 32768}"
SPS="${SPS:-1 2 4}" UNCHUNKED_MAX="${UNCHUNKED_MAX:-4096}"
rm -rf "$OUT"; mkdir -p "$OUT"
for S in $LENGTHS; do
  "$BIN" gen-toy-data --out "$OUT/data-$S" --num-samples 2 --min-len "$S" --max-len "$S" \
    --vocab-size 32768 --draft-vocab-size 32000 --samples-per-dir 2 >/dev/null
  # Native shards: each rank of a group reads only its slice (docs/usage.md "Sequence parallelism").
  "$BIN" convert --input "$OUT/data-$S/hidden_states" --output "$OUT/data-$S/native" >/dev/null
  "$PY" - "$OUT/data-$S/draft_config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_attention_heads=4, num_key_value_heads=4, head_dim=16)
json.dump(c, open(sys.argv[1], "w"), indent=1)
PYEOF
  for head in 1024 -1; do
    [ "$head" -eq -1 ] && [ "$S" -gt "$UNCHUNKED_MAX" ] && continue
    for sp in $SPS; do
      echo "[seq-parallel] S $S, --sp-ulysses-size $sp, --head-chunk-rows $head"
      # Every rank's peak RSS (GNU time: the maximum resident set of the rank's process), one
      # file per rank (the ranks' stderr lines interleave under mpirun).
      rss="$OUT/rss-$S-$head-$sp"
      launch=(sh -c 'exec /usr/bin/time -f "%M" -o "$0.${OMPI_COMM_WORLD_RANK:-0}" "$@"' "$rss" "$BIN")
      [ "$sp" -gt 1 ] && launch=("$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n "$sp" "${launch[@]}")
      "${launch[@]}" --target-model-path "$OUT/data-$S/target" \
        --draft-model-config "$OUT/data-$S/draft_config.json" \
        --train-hidden-states-path "$OUT/data-$S/native" --cache-dir "$OUT/cache-$S" \
        --output-dir "$OUT/run-$S-$head-$sp" --max-length "$S" --ttt-length 7 \
        --draft-global-batch-size 1 --draft-micro-batch-size 1 --max-steps 1 --log-steps 1 \
        --mixed-precision fp32 --head-chunk-rows "$head" --save-final false --save-interval 0 \
        --sp-ulysses-size "$sp" --device cpu --threads 1 >"$OUT/run-$S-$head-$sp.log" 2>&1 &&
        rc=0 || rc=$?
      [ $rc -eq 0 ] || [ $rc -eq 2 ] || { tail -20 "$OUT/run-$S-$head-$sp.log"; exit 1; }
    done
  done
done
"$PY" - "$OUT" "$SPS" $LENGTHS <<'PYEOF'
import json, sys
out, sps, lengths = sys.argv[1], [int(x) for x in sys.argv[2].split()], [int(s) for s in sys.argv[3:]]
def rows(s, head, sp):
    try:
        return [json.loads(l) for l in open(f"{out}/run-{s}-{head}-{sp}/metrics.jsonl")]
    except FileNotFoundError:
        return None  # not run, or refused by the start-up memory check
def peak(s, head, sp):
    # The largest rank's: which rank peaks depends on where the sample's loss rows fall.
    if rows(s, head, sp) is None:
        return None
    kib = [int(open(f"{out}/rss-{s}-{head}-{sp}.{r}").read().split()[-1]) for r in range(sp)]
    assert len(kib) == sp, (s, head, sp, kib)
    return max(kib) / 1024
def read(s, head, sp):
    r = rows(s, head, sp)
    return None if r is None else max(x.get("perf/read_mib_per_step", 0) for x in r) * 1024
def worst(s, head, sp):
    a, b = rows(s, head, 1), rows(s, head, sp)
    if a is None or b is None:
        return None
    a = [x for x in a if "train/loss" in x]
    b = [x for x in b if "train/loss" in x]
    w = 0.0
    for x, y in zip(a, b):
        for k, v in x.items():
            if k.startswith("train/") and k != "train/epoch":
                w = max(w, abs(v - y[k]) / max(1.0, abs(v)))
    return w
for head, name in ((1024, "chunked head (1024 rows)"), (-1, "unchunked head")):
    print(f"\n{name}: the largest rank's peak RSS, MiB (KiB per token above S = {lengths[0]}); "
          "KiB rank 0 read\n")
    print("| S | " + " | ".join(f"SP {sp}" for sp in sps) + " | read, KiB (" +
          " / ".join(f"SP {sp}" for sp in sps) + ") | metrics vs SP 1 (worst rel.) |")
    print("|---" * (len(sps) + 3) + "|")
    for s in lengths:
        cells, diffs, reads = [], [], []
        for sp in sps:
            p, p0 = peak(s, head, sp), peak(lengths[0], head, sp)
            if p is None:
                cells.append("not run")
                continue
            per = "" if s == lengths[0] or p0 is None else f" ({(p - p0) * 1024 / (s - lengths[0]):.0f})"
            cells.append(f"{p:.0f}{per}")
            reads.append(f"{read(s, head, sp):.0f}")
            if sp > 1:
                w = worst(s, head, sp)
                if w is not None:
                    diffs.append(f"SP {sp}: {w:.1e}")
        if all(c == "not run" for c in cells):
            continue
        print(f"| {s} | " + " | ".join(cells) + " | " + " / ".join(reads) + " | " +
              ", ".join(diffs) + " |")
PYEOF
