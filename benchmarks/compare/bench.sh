#!/usr/bin/env bash
# Side-by-side benchmark: fsdp-train and the PyTorch FSDP2 reference on the real SmolLM2 features,
# same config and initial weights, at 1 and 2 ranks: steps/s, tokens/s, peak RSS per rank, the
# ratio fsdp-train/reference, and held-out acc_0..acc_6 after a fixed step budget. Never prints a
# number that the runs did not produce.
#
# Usage: benchmarks/compare/bench.sh [FSDP_TRAIN_BINARY]
# Env:   FSDP_PYTHON, DATA (default ~/.cache/fsdp-train/realdata/smollm2-135m-chitchat-L512-seed0-
#        bf16, built by benchmarks/realdata/make_features.py), STEPS (8), GLOBAL_BATCH (4),
#        MAX_LENGTH (512), RANKS ("1 2"), LR (5e-4), PRECISION (bf16), WORK (scratch dir),
#        REFERENCE_ONLY=1 (measure only the reference), THREADS (per rank; default cores/ranks),
#        DEEPSPEED=1 (also the DeepSpeed reference, benchmarks/reference/deepspeed_train.py, at
#        each ZeRO stage of ZERO_STAGES, default "3 2", from the same initial export, and with
#        stage 2 also fsdp-train --sharding-strategy shard_grad_op, its ZeRO-2; needs
#        benchmarks/reference/setup_deepspeed.sh; its python: DS_PYTHON, default
#        ~/.cache/fsdp-train/deepspeed-venv/bin/python), LM_HEAD_KEY (lm_head.weight;
#        model.embed_tokens.weight for a target with tied embeddings, e.g. the SmolLM2 features
#        of benchmarks/serving in ~/.cache/fsdp-train/serving/<hash>/ linked as train/ eval/),
#        PACKING (1: also fsdp-train --packing, the same samples per step packed into
#        micro-batches of --max-length tokens; 0: not).
#
# Assumptions about fsdp-train (flags not final when written; adjust here):
#   - docs/reference.md §8 flag names at the root level, launched as `mpirun -n W fsdp-train ...`;
#   - --init-checkpoint DIR (config.json + model.safetensors, docs/reference.md §7) for the shared initial draft;
#   - --mixed-precision bf16|fp32, --reduce-dtype fp32, --threads N;
#   - --report-to jsonl --log-steps 1: <output-dir>/metrics.jsonl per step with perf/tokens_per_s,
#     perf/step_time_s and mem/host_peak_rss_gib (the reference writes perf/tokens, perf/step_s
#     and mem/peak_rss_mib per rank; benchmarks/compare/metrics.py reads both);
#   - it exports <output-dir>/epoch_<E>_step_<S>/ (docs/reference.md §7) at the end of the run.
# Quality: both final exports are evaluated by the same code (the reference's --eval-only) on
# DATA/eval, so acc_i differences come from training, not from two evaluators.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
TORCHRUN="$(dirname "$PY")/torchrun"
BIN="${1:-${FSDP_TRAIN:-}}"
DATA="${DATA:-$HOME/.cache/fsdp-train/realdata/smollm2-135m-chitchat-L512-seed0-bf16}"
STEPS="${STEPS:-8}"
GB="${GLOBAL_BATCH:-4}"
MAXLEN="${MAX_LENGTH:-512}"
RANKS="${RANKS:-1 2}"
LR="${LR:-5e-4}"
PREC="${PRECISION:-bf16}"
WORK="${WORK:-$(mktemp -d /tmp/fsdp-bench.XXXXXX)}"
MPIRUN="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}"

die() { echo "bench.sh: error: $*" >&2; exit 2; }
[[ -x "$PY" ]] || die "python $PY not found (set FSDP_PYTHON)"
if [[ "${REFERENCE_ONLY:-0}" != 1 ]]; then
  [[ -n "$BIN" && -x "$BIN" ]] || die "fsdp-train binary not given or not executable: '$BIN'
  hint: pass build-<you>/apps/fsdp-train/fsdp-train (or set REFERENCE_ONLY=1)"
fi
DSPY="${DS_PYTHON:-$HOME/.cache/fsdp-train/deepspeed-venv/bin/python}"
DS_STAGES=""
if [[ "${DEEPSPEED:-0}" == 1 ]]; then
  DS_STAGES="${ZERO_STAGES:-3 2}"
  [[ -x "$DSPY" ]] && "$DSPY" -c 'import deepspeed' >/dev/null 2>&1 ||
    die "DEEPSPEED=1 but no deepspeed in $DSPY: run benchmarks/reference/setup_deepspeed.sh"
fi
for p in train eval target draft-config.json; do
  [[ -e "$DATA/$p" ]] || die "$DATA/$p missing; run benchmarks/realdata/make_features.py first"
done
mkdir -p "$WORK"
NTRAIN=$(find "$DATA/train/" -name '*.ckpt' | wc -l)   # the trailing / follows a linked folder
NEVAL=$(find "$DATA/eval/" -name '*.ckpt' | wc -l)

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== data: $DATA ($NTRAIN train / $NEVAL eval samples), steps $STEPS, global batch $GB," \
     "max length $MAXLEN, lr $LR, precision $PREC"

COMMON=(--target-model-path "$DATA/target" --draft-model-config "$DATA/draft-config.json"
        --lm-head-key "${LM_HEAD_KEY:-lm_head.weight}" --train-hidden-states-path "$DATA/train" --draft-global-batch-size "$GB"
        --draft-micro-batch-size 1 --max-length "$MAXLEN" --ttt-length 7 --total-steps "$STEPS"
        --num-epochs 1000 --seed 0 --learning-rate "$LR" --warmup-ratio 0.015 --max-grad-norm 0.5
        --log-steps 1)

INIT="$WORK/init"
"$PY" "$REPO/benchmarks/reference/train.py" "${COMMON[@]}" --eval-only --threads 1 \
    --save-init "$INIT" --output-dir "$WORK/init-run" --cache-dir "$WORK/cache" \
    >"$WORK/init-run.log" 2>&1 || { tail "$WORK/init-run.log"; exit 1; }

ref_eval() {  # $1 export dir, $2 out dir: held-out acc by the reference evaluator
  "$PY" "$REPO/benchmarks/reference/train.py" "${COMMON[@]}" --eval-only --init-weights "$1" \
      --eval-hidden-states-path "$DATA/eval" --threads "$(nproc)" --output-dir "$2" \
      --cache-dir "$WORK/cache" >"$2.log" 2>&1 || { tail "$2.log"; exit 1; }
  "$PY" "$HERE/metrics.py" eval "$2/metrics.jsonl"
}

SUMMARY="$WORK/summary.json"
echo '{"runs": {}}' >"$SUMMARY"
record() {  # $1 ranks, $2 trainer, $3 key, $4 JSON
  "$PY" - "$SUMMARY" "$1" "$2" "$3" "$4" <<'EOF'
import json, sys
path, w, name, key, value = sys.argv[1:]
s = json.load(open(path))
s["runs"].setdefault(w, {}).setdefault(name, {})[key] = json.loads(value)
json.dump(s, open(path, "w"), indent=1)
EOF
}

run_fsdp_train() {  # $1 ranks, $2 threads, $3 name in the tables, $4 out dir, then extra flags
  local W="$1" threads="$2" name="$3" out="$4" export_dir
  shift 4
  echo "== $name, $W rank(s), $threads thread(s) each"
  rm -rf "$out"   # a fresh run (fsdp-train refuses to start fresh over earlier checkpoints)
  # --save-interval 0: only the final export, as the references write (a checkpoint per epoch
  # would count in fsdp-train's step times).
  $MPIRUN -n "$W" "$BIN" "${COMMON[@]}" --init-checkpoint "$INIT" --mixed-precision "$PREC" \
      --reduce-dtype fp32 --threads "$threads" --report-to jsonl --output-dir "$out" --save-interval 0 \
      --cache-dir "$WORK/cache" "$@" >"$out.log" 2>&1 || { tail "$out.log"; exit 1; }
  record "$W" "$name" perf "$("$PY" "$HERE/metrics.py" perf "$out/metrics.jsonl")"
  export_dir="$(ls -d "$out"/epoch_*_step_* 2>/dev/null | sort -V | tail -1)"
  [[ -n "$export_dir" ]] || die "fsdp-train wrote no epoch_*_step_* export in $out"
  record "$W" "$name" eval "$(ref_eval "$export_dir" "$out-eval")"
}

for W in $RANKS; do
  threads="${THREADS:-$(( $(nproc) / W ))}"; (( threads >= 1 )) || threads=1
  echo "== reference, $W rank(s), $threads thread(s) each"
  out="$WORK/ref-w$W"
  "$TORCHRUN" --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
      "$REPO/benchmarks/reference/train.py" "${COMMON[@]}" --param-dtype "$PREC" \
      --init-weights "$INIT" --threads "$threads" --output-dir "$out" --save-final \
      --cache-dir "$WORK/cache" >"$out.log" 2>&1 || { tail "$out.log"; exit 1; }
  record "$W" reference perf "$("$PY" "$HERE/metrics.py" perf "$out/metrics.jsonl")"
  record "$W" reference eval "$(ref_eval "$(ls -d "$out"/epoch_*_step_* | sort -V | tail -1)" "$out-eval")"
  for Z in $DS_STAGES; do
    echo "== DeepSpeed ZeRO-$Z, $W rank(s), $threads thread(s) each"
    out="$WORK/ds$Z-w$W"
    "$DSPY" -m torch.distributed.run --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
        "$REPO/benchmarks/reference/deepspeed_train.py" --zero-stage "$Z" "${COMMON[@]}" \
        --param-dtype "$PREC" --init-weights "$INIT" --threads "$threads" --output-dir "$out" \
        --save-final --cache-dir "$WORK/cache" >"$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
    record "$W" "deepspeed-zero$Z" perf "$("$PY" "$HERE/metrics.py" perf "$out/metrics.jsonl")"
    record "$W" "deepspeed-zero$Z" eval "$(ref_eval "$(ls -d "$out"/epoch_*_step_* | sort -V | tail -1)" "$out-eval")"
  done
  [[ "${REFERENCE_ONLY:-0}" == 1 ]] && continue
  run_fsdp_train "$W" "$threads" fsdp-train "$WORK/cpp-w$W"
  if [[ "${PACKING:-1}" == 1 ]]; then
    run_fsdp_train "$W" "$threads" fsdp-train-packed "$WORK/cpp-packed-w$W" --packing
  fi
  # With DeepSpeed's ZeRO-2 in the run, fsdp-train's own ZeRO-2 as well: the like-for-like row.
  if [[ " $DS_STAGES " == *" 2 "* ]]; then
    run_fsdp_train "$W" "$threads" fsdp-train-shard_grad_op "$WORK/cpp-sgo-w$W" \
        --sharding-strategy shard_grad_op
  fi
done

echo
"$PY" "$HERE/metrics.py" table "$SUMMARY"
echo
echo "bench.sh: summary $SUMMARY, logs in $WORK (throughput excludes each run's first step;" \
     "peak RSS is the largest rank's; the breakdown is fsdp-train's perf/<phase>_s over those" \
     "steps)"
