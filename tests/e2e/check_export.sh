#!/usr/bin/env bash
# `fsdp-train check-export` end to end: a toy training's checkpoint passes (exit 0, no ERROR line;
# every save already ran the same check on itself), broken copies of it fail with exit 1 naming
# what is broken (a missing lm_head, a truncated model.safetensors: never a crash), and bad flags
# are usage errors (exit 2 with a HINT).
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/check_export"; rm -rf "$W"; mkdir -p "$W"

run_np 1 $(train_args "$DATA" "$W/run") --draft-global-batch-size 2 --draft-micro-batch-size 2 \
  --num-epochs 1 --max-steps 2 --save-interval 0 >"$W/train.log" 2>&1 || { cat "$W/train.log"; fail "training"; }
CK=$(latest_ckpt "$W/run")
[ -n "$CK" ] && [ -f "$CK/COMPLETE" ] || fail "no complete checkpoint in $W/run"

# The checkpoint as saved: OK for both engines, with and without the target's layer count.
out=$("$BIN" check-export "$CK" 2>&1); rc=$?
[ $rc -eq 0 ] || { echo "$out"; fail "check-export on the saved checkpoint: exit $rc"; }
grep -q "^OK    lm_head.weight:" <<<"$out" || { echo "$out"; fail "no OK line for lm_head.weight"; }
grep -q "^OK    t2d:" <<<"$out" || { echo "$out"; fail "no OK line for t2d"; }
grep -q "^check-export: .* 0 ERROR (checked in" <<<"$out" || { echo "$out"; fail "no summary line"; }
grep "^check-export:" <<<"$out"
out=$("$BIN" check-export "$CK" --for vllm --target-model-path "$DATA/target" 2>&1); rc=$?
[ $rc -eq 0 ] || { echo "$out"; fail "check-export --for vllm --target-model-path: exit $rc"; }
grep -q "^ERROR" <<<"$out" && { echo "$out"; fail "an ERROR line with exit 0"; }

# A copy without lm_head.weight: exit 1, the tensor named.
cp -r "$CK" "$W/no_head"
"$PY" - "$W/no_head/model.safetensors" <<'PYEOF' || fail "rewriting the copy"
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
del t["lm_head.weight"]
save_file(t, sys.argv[1])
PYEOF
out=$("$BIN" check-export "$W/no_head" 2>&1); rc=$?
[ $rc -eq 1 ] || { echo "$out"; fail "check-export without lm_head: exit $rc, expected 1"; }
grep -q "^ERROR lm_head.weight: missing" <<<"$out" || { echo "$out"; fail "lm_head not named"; }
grep -q -- "---> HINT:" <<<"$out" || { echo "$out"; fail "no HINT"; }

# A truncated model.safetensors: an ERROR line, exit 1, not a crash.
cp -r "$CK" "$W/truncated"
truncate -s 100 "$W/truncated/model.safetensors"
out=$("$BIN" check-export "$W/truncated" 2>&1); rc=$?
[ $rc -eq 1 ] || { echo "$out"; fail "check-export on a truncated file: exit $rc, expected 1"; }
grep -q "^ERROR model.safetensors:" <<<"$out" || { echo "$out"; fail "truncated file not named"; }

# Usage errors.
expect_usage_error "no directory" "$BIN" check-export
expect_usage_error "missing directory" "$BIN" check-export "$W/none"
expect_usage_error "bad --for" "$BIN" check-export "$CK" --for tensorrt
grep -q -- "--for" <<<"$out" || fail "bad --for: flag not named"
expect_usage_error "bad --target-model-path" "$BIN" check-export "$CK" --target-model-path "$W/none"
echo "check_export: OK"
