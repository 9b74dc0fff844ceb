#!/usr/bin/env bash
# The README's first command: install + build fsdp-train (launch/setup.sh), generate toy data,
# train a tiny EAGLE3 draft with 2 ranks on this machine's CPU, then print the held-out accuracy
# per TTT step against chance and where the checkpoint and metrics are.
#   FSDP_QUICKSTART_DIR  data + outputs (default ~/.cache/fsdp-train/quickstart)
#   FSDP_QUICKSTART_NP   ranks (default 2)
#   extra arguments are passed to the training command (e.g. --num-epochs 2)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Only the executable this script runs: the test suite is launch/test.sh's to build.
bash "$REPO/launch/setup.sh" fsdp-train
BUILD="${FSDP_BUILD_DIR:-$REPO/build}"
BIN="$BUILD/fsdp-train"
WORK="${FSDP_QUICKSTART_DIR:-$HOME/.cache/fsdp-train/quickstart}"
NP="${FSDP_QUICKSTART_NP:-2}"
DATA="$WORK/toy"
OUT="$WORK/run"

if [ ! -f "$DATA/.complete" ]; then
  echo "[quickstart] generating toy data in $DATA"
  rm -rf "$DATA"
  "$BIN" gen-toy-data --out "$DATA" --num-samples 320 --samples-per-dir 32 --seed 0
  # Hold the last folder of samples out for evaluation.
  mkdir -p "$DATA/eval_hidden_states"
  last="$(ls -d "$DATA"/hidden_states/rows_* | sort -V | tail -n 1)"
  mv "$last" "$DATA/eval_hidden_states/"
  touch "$DATA/.complete"
fi

rm -rf "$OUT"
echo "[quickstart] training with $NP ranks (output: $OUT)"
"$BIN" --nproc-per-node "$NP" --config "$REPO/configs/runs/quickstart.yaml" \
  --target-model-path "$DATA/target" --draft-model-config "$DATA/draft_config.json" \
  --train-hidden-states-path "$DATA/hidden_states" \
  --eval-hidden-states-path "$DATA/eval_hidden_states" --eval-interval 1 \
  --cache-dir "$DATA/cache" --output-dir "$OUT" "$@"

ckpt="$(ls -d "$OUT"/epoch_*_step_* 2>/dev/null | sort -V | tail -n 1)"
[ -n "$ckpt" ] || { echo "[quickstart] no checkpoint was written" >&2; exit 1; }
vd="$("${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}/bin/python" -c \
  'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("draft_vocab_size") or c["vocab_size"])' \
  "$DATA/draft_config.json")"
echo
echo "[quickstart] held-out accuracy of the trained draft (acc_i: step i of the TTT unroll):"
"$BIN" --init-checkpoint "$ckpt" --eval-only \
  --target-model-path "$DATA/target" --draft-model-config "$DATA/draft_config.json" \
  --eval-hidden-states-path "$DATA/eval_hidden_states" --cache-dir "$DATA/cache" \
  --max-length 128 --draft-micro-batch-size 2 --draft-global-batch-size 2 --device cpu \
  2>"$OUT/eval.log" |
  tr ' ' '\n' | grep -E '^eval/(acc_[0-9]+|accept_len)=' | while IFS='=' read -r k v; do
    if [ "$k" = eval/accept_len ]; then
      awk -v v="$v" 'BEGIN { printf "  %-12s %.2f    (greedy chain drafting simulated on the unroll: tokens per target step, 1 to 8)\n", "accept_len", v }'
    else
      awk -v k="$k" -v v="$v" -v vd="$vd" 'BEGIN { printf "  %-12s %.3f   (chance: %.4f = 1/%d)\n", k, v, 1 / vd, vd }'
    fi
  done
echo
echo "[quickstart] checkpoint (serving format: config.json + model.safetensors): $ckpt"
echo "[quickstart] metrics: $OUT/metrics.jsonl, TensorBoard: $OUT/tensorboard (evaluation log: $OUT/eval.log)"
