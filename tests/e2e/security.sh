#!/usr/bin/env bash
# Data-handling security through the binary: a .ckpt whose pickle asks to run a command is
# rejected without running it; files get mode 0640 and directories 0750 under any umask; a W&B key given on the command
# line appears in no log line and no saved file.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/security"; rm -rf "$W"; mkdir -p "$W"
MARK="$W/pwned"

# A torch.save archive whose payload calls os.system when unpickled by Python.
cp -r "$DATA" "$W/data"
victim="$(head -n 1 <<<"$(ls "$W"/data/hidden_states/rows_*/*.ckpt | sort)")"
"$PY" - "$victim" "$MARK" <<'PYEOF' || fail "could not build the malicious file"
import os, sys, torch
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
good = torch.load(sys.argv[1])
good["input_ids"] = Payload()
torch.save(good, sys.argv[1])
PYEOF
[ -e "$MARK" ] && fail "building the file already ran the payload"
# convert reads every file, so the malicious one is certainly opened.
out="$("$BIN" convert --input "$W/data/hidden_states" --output "$W/native" 2>&1)"; rc=$?
[ -e "$MARK" ] && fail "the pickle payload was executed"
[ $rc -eq 2 ] && [ "$(grep -c -- "---> HINT:" <<<"$out")" -ge 1 ] ||
  { echo "$out" | tail -5; fail "malicious file: exit $rc, expected 2 and a ---> HINT line"; }
grep -q "$(basename "$victim")" <<<"$out" || { echo "$out" | tail -5; fail "error does not name the file"; }
echo "ok: malicious pickle rejected without running it"

# Output directory permissions and secrets.
SECRET="wandb-secret-$RANDOM$RANDOM"
# Under umask 000 (a permissive caller): every file the run creates is 0640 and every directory
# 0750 all the same.
# A W&B key without W&B among the sinks is refused (it would do nothing), and not echoed.
expect_usage_error "--wandb-key without --report-to wandb" "$BIN" $(train_args "$DATA" "$W/run/nokey") \
  --report-to tensorboard --wandb-key "$SECRET"
grep -q -- "--report-to wandb" <<<"$out" || { echo "$out" | tail -5; fail "the refusal does not name --report-to wandb"; }
grep -q "$SECRET" <<<"$out" && fail "the W&B key was printed in the refusal"
out="$(umask 000; "$BIN" $(train_args "$DATA" "$W/run/out") --draft-global-batch-size 2 --draft-micro-batch-size 2 \
  --num-epochs 1 --max-steps 2 --report-to tensorboard 2>&1)"; rc=$?
[ $rc -eq 0 ] || { echo "$out" | tail -5; fail "training run exited $rc"; }
[ "$(stat -c %a "$W/run/out")" = 750 ] || fail "output dir mode $(stat -c %a "$W/run/out"), expected 750"
ck="$(latest_ckpt "$W/run/out")"
[ "$(stat -c %a "$ck")" = 750 ] || fail "checkpoint dir mode $(stat -c %a "$ck"), expected 750"
for f in "$W/run/out/run_config.yaml" "$W/run/out/metrics.jsonl" "$ck/model.safetensors"; do
  [ "$(stat -c %a "$f")" = 640 ] || fail "$f: mode $(stat -c %a "$f") under umask 000, expected 640"
done
for d in "$ck/train_state" "$W/run/out/tensorboard"; do
  [ "$(stat -c %a "$d")" = 750 ] || fail "$d: mode $(stat -c %a "$d") under umask 000, expected 750"
done
loose="$(find "$W/run/out" \( -type f -perm /0137 \) -o \( -type d -perm /0027 \))"
[ -z "$loose" ] || fail "created with modes beyond 0640/0750 under umask 000: $loose"
grep -q "$SECRET" <<<"$out" && fail "the W&B key was printed"
grep -rq "$SECRET" "$W/run" && fail "the W&B key was written under the output directory"
echo "ok: modes 750, key never printed or saved"
echo PASS
