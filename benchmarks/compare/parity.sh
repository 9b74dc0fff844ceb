#!/usr/bin/env bash
# Parity of fsdp-train against the PyTorch FSDP2 reference: same initial weights, same batches,
# fp32, 1 and 2 ranks; ploss_i/acc_i of the first steps must agree to 1e-4 relative.
# Never edits either trainer's output; a missing binary is an error, not a skipped check.
#
# Usage: benchmarks/compare/parity.sh [FSDP_TRAIN_BINARY]
# Env:   FSDP_PYTHON (venv python), DATA (features root with train/, target/, draft-config.json;
#        default: toy features generated here), STEPS (3), GLOBAL_BATCH (2), MAX_LENGTH (512),
#        RANKS ("1 2"), RTOL (1e-4), WORK (scratch dir), LR (1e-3: large, so drift shows early),
#        REFERENCE_ONLY=1 (only the reference at each world size, compared across world sizes),
#        DEVICE (cpu; cuda: both trainers on the GPU, one rank per GPU: benchmarks/device/run.sh).
#
# Assumptions about fsdp-train (its flags were not final when this was written; adjust here):
#   - SpecForge flag names of docs/reference.md §8 at the root level (no subcommand), launched as
#     `mpirun -n W fsdp-train ...` (MPIRUN overrides the launcher command).
#   - --init-checkpoint DIR loads config.json + model.safetensors (docs/reference.md §7), including
#     d2t/t2d, so both trainers share the initial weights and the vocab mapping.
#   - --mixed-precision fp32 --reduce-dtype fp32 for an all-fp32 run.
#   - --report-to jsonl --log-steps 1 writes <output-dir>/metrics.jsonl with one line per step
#     holding train/ploss_i and train/acc_i (acc token-weighted over the step's micro-batches).
# The initial weights come from the reference's --save-init export (bf16, docs/reference.md §7): both trainers
# start from the same bf16-representable fp32 values. Set INIT=DIR to use an export made by
# fsdp-train instead.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
TORCHRUN=("$(dirname "$PY")/torchrun")
[[ -x "${TORCHRUN[0]}" ]] || TORCHRUN=("$PY" -m torch.distributed.run)
BIN="${1:-${FSDP_TRAIN:-}}"
STEPS="${STEPS:-3}"
GB="${GLOBAL_BATCH:-2}"
MAXLEN="${MAX_LENGTH:-512}"
RANKS="${RANKS:-1 2}"
RTOL="${RTOL:-1e-4}"
LR="${LR:-1e-3}"
WORK="${WORK:-$(mktemp -d /tmp/fsdp-parity.XXXXXX)}"
MPIRUN="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}"

die() { echo "parity.sh: error: $*" >&2; exit 2; }
[[ -x "$PY" ]] || die "python $PY not found (set FSDP_PYTHON)"
if [[ "${REFERENCE_ONLY:-0}" != 1 ]]; then
  [[ -n "$BIN" && -x "$BIN" ]] || die "fsdp-train binary not given or not executable: '$BIN'
  hint: pass build-<you>/apps/fsdp-train/fsdp-train (or set REFERENCE_ONLY=1)"
fi
mkdir -p "$WORK"
if [[ -z "${DATA:-}" ]]; then
  DATA="$WORK/toy"
  "$PY" "$REPO/benchmarks/reference/make_toy.py" "$DATA" --samples 16 --eval-samples 4 >/dev/null
fi
for p in train target draft-config.json; do [[ -e "$DATA/$p" ]] || die "$DATA/$p missing"; done
LMKEY=lm_head.weight

COMMON=(--target-model-path "$DATA/target" --draft-model-config "$DATA/draft-config.json"
        --lm-head-key "$LMKEY" --train-hidden-states-path "$DATA/train"
        --draft-global-batch-size "$GB" --draft-micro-batch-size 1 --max-length "$MAXLEN"
        --ttt-length 7 --total-steps "$STEPS" --num-epochs 1 --seed 0 --learning-rate "$LR"
        --warmup-ratio 0.015 --max-grad-norm 0.5 --log-steps 1 --device "${DEVICE:-cpu}")

INIT="${INIT:-}"
if [[ -z "$INIT" ]]; then
  INIT="$WORK/init"
  echo "== exporting initial weights with the reference -> $INIT"
  "$PY" "$REPO/benchmarks/reference/train.py" "${COMMON[@]}" --eval-only --threads 1 \
      --param-dtype fp32 --save-init "$INIT" --output-dir "$WORK/init-run" \
      --cache-dir "$WORK/cache" >"$WORK/init-run.log" 2>&1 || { tail "$WORK/init-run.log"; exit 1; }
fi

rc=0
first_ref=""
for W in $RANKS; do
  echo "== reference, $W rank(s)"
  threads=$(( $(nproc) / W )); (( threads >= 1 )) || threads=1
  "${TORCHRUN[@]}" --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
      "$REPO/benchmarks/reference/train.py" "${COMMON[@]}" --param-dtype fp32 \
      --init-weights "$INIT" --threads "$threads" --output-dir "$WORK/ref-w$W" \
      --cache-dir "$WORK/cache" >"$WORK/ref-w$W.log" 2>&1 || { tail "$WORK/ref-w$W.log"; exit 1; }
  if [[ -z "$first_ref" ]]; then
    first_ref="$WORK/ref-w$W/metrics.jsonl"
  else
    echo "-- reference at $W ranks vs the first world size"
    "$PY" "$HERE/metrics.py" parity "$first_ref" "$WORK/ref-w$W/metrics.jsonl" --steps "$STEPS" \
        --rtol "$RTOL" || rc=1
  fi
  [[ "${REFERENCE_ONLY:-0}" == 1 ]] && continue
  echo "== fsdp-train, $W rank(s)"
  rm -rf "$WORK/cpp-w$W"   # a fresh run (fsdp-train refuses to start fresh over earlier checkpoints)
  $MPIRUN -n "$W" "$BIN" "${COMMON[@]}" --init-checkpoint "$INIT" --mixed-precision fp32 \
      --reduce-dtype fp32 --threads "$threads" --report-to jsonl --output-dir "$WORK/cpp-w$W" \
      --cache-dir "$WORK/cache" >"$WORK/cpp-w$W.log" 2>&1 || { tail "$WORK/cpp-w$W.log"; exit 1; }
  echo "-- fsdp-train vs reference at $W rank(s) (A = reference, B = fsdp-train)"
  "$PY" "$HERE/metrics.py" parity "$WORK/ref-w$W/metrics.jsonl" "$WORK/cpp-w$W/metrics.jsonl" \
      --steps "$STEPS" --rtol "$RTOL" || rc=1
done
echo "parity.sh: logs and metrics in $WORK; overall $([[ $rc == 0 ]] && echo PASS || echo FAIL)"
exit $rc
