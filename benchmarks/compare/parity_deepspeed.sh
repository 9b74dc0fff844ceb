#!/usr/bin/env bash
# Parity of the DeepSpeed reference (benchmarks/reference/deepspeed_train.py, ZeRO-3 and ZeRO-2)
# against fsdp-train: same initial weights, same batches, fp32, 1 and 2 ranks; ploss_i/acc_i of
# the first steps must agree to RTOL relative. The companion of parity.sh (fsdp-train vs the
# FSDP2 reference), with the same data, flags and initial export.
#
# Usage: benchmarks/compare/parity_deepspeed.sh FSDP_TRAIN_BINARY
# Env:   DS_PYTHON (python with deepspeed; default ~/.cache/fsdp-train/deepspeed-venv/bin/python,
#        made by benchmarks/reference/setup_deepspeed.sh), FSDP_PYTHON (the project venv's python,
#        for the initial export and metrics.py), DATA (features root with train/, target/,
#        draft-config.json; default: toy features generated here), STEPS (3), GLOBAL_BATCH (2),
#        MAX_LENGTH (512), RANKS ("1 2"), ZERO_STAGES ("3 2"), RTOL (1e-4), LR (1e-3), WORK,
#        INIT (an export dir to start from instead of the reference's --save-init), LM_HEAD_KEY
#        (lm_head.weight; model.embed_tokens.weight for a target with tied embeddings such as
#        SmolLM2's).
# Exit: 0 all comparisons pass, 1 a value differs, 2 a missing tool (deepspeed not installed:
# run benchmarks/reference/setup_deepspeed.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
DSPY="${DS_PYTHON:-$HOME/.cache/fsdp-train/deepspeed-venv/bin/python}"
BIN="${1:-${FSDP_TRAIN:-}}"
STEPS="${STEPS:-3}"
GB="${GLOBAL_BATCH:-2}"
MAXLEN="${MAX_LENGTH:-512}"
RANKS="${RANKS:-1 2}"
STAGES="${ZERO_STAGES:-3 2}"
RTOL="${RTOL:-1e-4}"
LR="${LR:-1e-3}"
WORK="${WORK:-$(mktemp -d /tmp/fsdp-parity-ds.XXXXXX)}"
MPIRUN="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}"

die() { echo "parity_deepspeed.sh: error: $*" >&2; exit 2; }
[[ -x "$PY" ]] || die "python $PY not found (set FSDP_PYTHON)"
[[ -x "$DSPY" ]] && "$DSPY" -c 'import deepspeed' >/dev/null 2>&1 ||
  die "no deepspeed in $DSPY: run benchmarks/reference/setup_deepspeed.sh (or set DS_PYTHON)"
[[ -n "$BIN" && -x "$BIN" ]] || die "fsdp-train binary not given or not executable: '$BIN'"
mkdir -p "$WORK"
if [[ -z "${DATA:-}" ]]; then
  DATA="$WORK/toy"
  "$PY" "$REPO/benchmarks/reference/make_toy.py" "$DATA" --samples 16 --eval-samples 4 >/dev/null
fi
for p in train target draft-config.json; do [[ -e "$DATA/$p" ]] || die "$DATA/$p missing"; done

COMMON=(--target-model-path "$DATA/target" --draft-model-config "$DATA/draft-config.json"
        --lm-head-key "${LM_HEAD_KEY:-lm_head.weight}" --train-hidden-states-path "$DATA/train"
        --draft-global-batch-size "$GB" --draft-micro-batch-size 1 --max-length "$MAXLEN"
        --ttt-length 7 --total-steps "$STEPS" --num-epochs 1 --seed 0 --learning-rate "$LR"
        --warmup-ratio 0.015 --max-grad-norm 0.5 --log-steps 1 --device cpu)

INIT="${INIT:-}"
if [[ -z "$INIT" ]]; then
  INIT="$WORK/init"
  echo "== exporting initial weights with the FSDP2 reference -> $INIT"
  "$PY" "$REPO/benchmarks/reference/train.py" "${COMMON[@]}" --eval-only --threads 1 \
      --param-dtype fp32 --save-init "$INIT" --output-dir "$WORK/init-run" \
      --cache-dir "$WORK/cache" >"$WORK/init-run.log" 2>&1 || { tail "$WORK/init-run.log"; exit 1; }
fi

rc=0
for W in $RANKS; do
  threads=$(( $(nproc) / W )); (( threads >= 1 )) || threads=1
  echo "== fsdp-train, $W rank(s)"
  rm -rf "$WORK/cpp-w$W"
  $MPIRUN -n "$W" "$BIN" "${COMMON[@]}" --init-checkpoint "$INIT" --mixed-precision fp32 \
      --reduce-dtype fp32 --threads "$threads" --report-to jsonl --output-dir "$WORK/cpp-w$W" \
      --cache-dir "$WORK/cache" >"$WORK/cpp-w$W.log" 2>&1 || { tail "$WORK/cpp-w$W.log"; exit 1; }
  for Z in $STAGES; do
    echo "== DeepSpeed ZeRO-$Z, $W rank(s)"
    out="$WORK/ds$Z-w$W"
    "$DSPY" -m torch.distributed.run --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
        "$REPO/benchmarks/reference/deepspeed_train.py" --zero-stage "$Z" "${COMMON[@]}" \
        --param-dtype fp32 --init-weights "$INIT" --threads "$threads" --output-dir "$out" \
        --cache-dir "$WORK/cache" >"$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
    echo "-- DeepSpeed ZeRO-$Z vs fsdp-train at $W rank(s) (A = fsdp-train, B = DeepSpeed)"
    "$PY" "$HERE/metrics.py" parity "$WORK/cpp-w$W/metrics.jsonl" "$out/metrics.jsonl" \
        --steps "$STEPS" --rtol "$RTOL" || rc=1
  done
done
echo "parity_deepspeed.sh: logs and metrics in $WORK; overall $([[ $rc == 0 ]] && echo PASS || echo FAIL)"
exit $rc
