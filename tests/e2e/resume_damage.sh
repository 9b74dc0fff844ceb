#!/usr/bin/env bash
# A damaged checkpoint on resume: a missing, truncated or bit-flipped shard file, a garbage
# manifest.txt or trainer_state.json, and a trainer_state.json whose step disagrees with the
# manifest. --resume PATH refuses each with exit code 2 naming the damaged file and a HINT;
# --resume auto falls back to the previous complete checkpoint with a warning naming the file
# and trains on (exit 0).
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/resume_damage"; rm -rf "$W"; mkdir -p "$W"
ARGS="$(train_args "$DATA" X | sed "s/--output-dir X//") --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 --save-interval 0"

# Checkpoints at steps 2 and 4.
"$BIN" $ARGS --output-dir "$W/base" --max-steps 4 --save-steps 2 >"$W/base.log" 2>&1 ||
  { tail "$W/base.log"; fail "base run"; }
[ -f "$W/base/epoch_0_step_2/COMPLETE" ] && [ -f "$W/base/epoch_0_step_4/COMPLETE" ] ||
  { ls "$W/base"; fail "no checkpoints at steps 2 and 4"; }

# damage KIND DIR: damages checkpoint DIR; prints the file name the messages must give.
damage() {
  local st="$2/train_state"
  case "$1" in
    missing_shard) rm "$st/shard_0.pt"; echo "shard_0.pt" ;;
    truncated_shard) head -c 200 "$st/shard_0.pt" >"$st/x" && mv "$st/x" "$st/shard_0.pt"; echo "shard_0.pt" ;;
    flipped_shard)
      "$PY" - "$st/shard_0.pt" <<'PYEOF' || fail "flipping a byte"
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x10; open(p, "wb").write(b)
PYEOF
      echo "shard_0.pt" ;;
    garbage_manifest) printf 'not a manifest\n' >"$st/manifest.txt"; echo "manifest.txt" ;;
    garbage_state) printf '{"step": 4, garbage' >"$2/trainer_state.json"; echo "trainer_state.json" ;;
    step_mismatch)
      grep -c '"step": 4,' "$2/trainer_state.json" >/dev/null || fail "trainer_state.json has no step 4"
      sed -i 's/"step": 4,/"step": 3,/' "$2/trainer_state.json"; echo "trainer_state.json" ;;
  esac
}

for kind in missing_shard truncated_shard flipped_shard garbage_manifest garbage_state step_mismatch; do
  # --resume PATH (into an empty --output-dir): exit 2 naming the file, with a hint.
  cp -r "$W/base" "$W/p_$kind"
  file="$(damage "$kind" "$W/p_$kind/epoch_0_step_4")"
  expect_usage_error "$kind: --resume PATH" "$BIN" $ARGS --output-dir "$W/p_out_$kind" --max-steps 5 --resume "$W/p_$kind/epoch_0_step_4"
  [ "$(grep -c -- "$file" <<<"$out")" -ge 1 ] || { tail -8 <<<"$out"; fail "$kind: --resume PATH does not name $file"; }
  # One hint, the refusal's own: the reader's error it quotes carries none of its own.
  [ "$(grep -c -- "---> HINT:" <<<"$out")" -eq 1 ] || { tail -8 <<<"$out"; fail "$kind: --resume PATH prints $(grep -c -- "---> HINT:" <<<"$out") HINT lines, expected 1"; }
  [ "$(grep -c "^step " <<<"$out")" -eq 0 ] || fail "$kind: --resume PATH trained"
  # --resume auto: falls back to step 2, the warning names the file; trains to step 5.
  cp -r "$W/base" "$W/a_$kind"
  damage "$kind" "$W/a_$kind/epoch_0_step_4" >/dev/null
  out="$("$BIN" $ARGS --output-dir "$W/a_$kind" --max-steps 5 --resume auto 2>&1)"; rc=$?
  warn="$(grep "could not be loaded" <<<"$out")"
  [ $rc -eq 0 ] && [ "$(grep -c -- "$file" <<<"$warn")" -ge 1 ] &&
    [ "$(grep -c "resumed from .*epoch_0_step_2 at step 2" <<<"$out")" -eq 1 ] ||
    { tail -8 <<<"$out"; fail "$kind: --resume auto exit $rc (expected 0, falling back past $file)"; }
  [ -f "$W/a_$kind/epoch_0_step_5/COMPLETE" ] || { ls "$W/a_$kind"; fail "$kind: no checkpoint of step 5"; }
  echo "ok: $kind ($file)"
  rm -rf "$W/p_$kind" "$W/p_out_$kind" "$W/a_$kind"
done
echo PASS
