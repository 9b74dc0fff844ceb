#!/usr/bin/env bash
# A checkpoint that cannot be written (full disk) never loses the run: every rank agrees the
# save failed, the partial directory goes, the earlier checkpoints stay, training goes on (the
# weights are unperturbed: the same losses as a run whose saves succeed), and a run that ends
# without its final checkpoint exits 1 naming the newest complete one, from which --resume
# continues. One rank's writes fail through FSDP_TEST_FAIL_WRITES_ON_RANK (a real full disk,
# EFBIG from a file size limit, is tested in unit_shard; MPI itself cannot start under one).
# A damaged newest checkpoint: --resume auto falls back to the next older one.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/save_failures"; rm -rf "$W"; mkdir -p "$W"
ARGS="$(train_args "$DATA" "$W/base") --mixed-precision fp32 --export-dtype fp32 --num-epochs 1 \
  --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --save-steps 2"

run_np 1 $ARGS --max-steps 2 >"$W/base.log" 2>&1 || { cat "$W/base.log"; fail "first run"; }
for d in inject1 inject2 clean; do cp -r "$W/base" "$W/$d"; done

# 2 ranks, rank 1's writes fail: the step-4 save fails on both ranks and training goes on; the
# final save fails too, so the run exits non-zero and names the step-2 checkpoint.
FSDP_TEST_FAIL_WRITES_ON_RANK=1 run_np 2 ${ARGS//$W\/base/$W\/inject2} --max-steps 5 --resume \
  >"$W/inject2.log" 2>&1 && { cat "$W/inject2.log"; fail "a run without its final checkpoint exited 0"; }
for want in "rank 1: the checkpoint of step 4 could not be written" \
            "checkpoint of step 4 NOT saved" "step 5/" \
            "training finished: the checkpoint of step 5 could not be written" \
            "the newest complete checkpoint is $W/inject2/epoch_0_step_2"; do
  grep -qF -- "$want" "$W/inject2.log" || { cat "$W/inject2.log"; fail "2 ranks: no '$want'"; }
done
[ "$(ls -A "$W/inject2" | grep -c '^\.tmp_')" -eq 0 ] || fail "a failed save left its temporary directory"
[ "$(latest_ckpt "$W/inject2")" = "$W/inject2/epoch_0_step_2" ] || fail "the earlier checkpoint is not the newest any more"

# 1 rank: the same failures; its losses equal those of a run whose saves succeed (a failed save
# changes nothing), and --resume then continues from step 2 to the end.
FSDP_TEST_FAIL_WRITES_ON_RANK=0 run_np 1 ${ARGS//$W\/base/$W\/inject1} --max-steps 5 --resume \
  >"$W/inject1.log" 2>&1; rc=$?
[ $rc -eq 3 ] || { cat "$W/inject1.log"; fail "1 rank without its final checkpoint: exit code $rc, expected 3"; }
run_np 1 ${ARGS//$W\/base/$W\/clean} --max-steps 5 --resume >"$W/clean.log" 2>&1 || { cat "$W/clean.log"; fail "run with working saves"; }
"$PY" - "$W/inject1/metrics.jsonl" "$W/clean/metrics.jsonl" <<'PYEOF' || fail "a failed save changed training"
import json, sys
def losses(path):
    rows = [json.loads(l) for l in open(path)]
    return {r["step"]: r["train/ploss_0"] for r in rows if r.get("step", 0) > 2 and "train/ploss_0" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == [3, 4, 5] and a == b, (a, b)
print("losses after failed saves equal a clean run's:", a)
PYEOF
run_np 1 ${ARGS//$W\/base/$W\/inject1} --max-steps 5 --resume >"$W/resume.log" 2>&1 || { cat "$W/resume.log"; fail "resume after failed saves"; }
grep -q "resumed from $W/inject1/epoch_0_step_2 at step 2" "$W/resume.log" || { cat "$W/resume.log"; fail "did not resume from step 2"; }
compare_exports "$(latest_ckpt "$W/inject1")" "$(latest_ckpt "$W/clean")" 0 || fail "resumed run differs"
# The newest checkpoint damaged (its shard file cut short): --resume auto warns, resumes from the
# older step-4 checkpoint and reaches bitwise the weights of a resume from the intact step 5.
cp -r "$W/clean" "$W/damaged"; cp -r "$W/clean" "$W/intact"
f="$W/damaged/epoch_0_step_5/train_state/shard_0.pt"
head -c $(( $(stat -c %s "$f") / 2 )) "$f" >"$f.cut" && mv "$f.cut" "$f"
run_np 1 ${ARGS//$W\/base/$W\/damaged} --max-steps 6 --resume >"$W/damaged.log" 2>&1 || { cat "$W/damaged.log"; fail "resume with a damaged newest checkpoint"; }
grep -q "cannot load checkpoint $W/damaged/epoch_0_step_5" "$W/damaged.log" &&
  grep -q "resumed from $W/damaged/epoch_0_step_4 at step 4" "$W/damaged.log" || { cat "$W/damaged.log"; fail "no fallback to the step-4 checkpoint"; }
run_np 1 ${ARGS//$W\/base/$W\/intact} --max-steps 6 --resume >"$W/intact.log" 2>&1 || { cat "$W/intact.log"; fail "resume from step 5"; }
compare_exports "$(latest_ckpt "$W/damaged")" "$(latest_ckpt "$W/intact")" 0 || fail "the fallback run differs"
# The damaged step-5 checkpoint is newer than the one resumed from: set aside (not deleted, not
# overwritten by the run's own step-5 save, not taken by a later --resume auto).
grep -q "set aside as $W/damaged/epoch_0_step_5.superseded" "$W/damaged.log" &&
  [ -f "$W/damaged/epoch_0_step_5.superseded/COMPLETE" ] ||
  { cat "$W/damaged.log"; ls "$W/damaged"; fail "the damaged newer checkpoint was not set aside"; }
# --resume PATH of the damaged one: no fallback, exit 2 naming it and the damaged file.
D5="$W/damaged/epoch_0_step_5.superseded"
expect_usage_error "--resume PATH of a damaged checkpoint" "$BIN" ${ARGS//$W\/base/$W\/damaged} --max-steps 7 --resume "$D5"
grep -q "$D5/train_state/shard_" <<<"$out" || { echo "$out"; fail "--resume PATH of a damaged checkpoint"; }
# A damaged weights file in the newest checkpoint: --resume auto passes over it too.
cp -r "$W/clean" "$W/dmg2"
f="$W/dmg2/epoch_0_step_5/model.safetensors"
head -c $(( $(stat -c %s "$f") / 2 )) "$f" >"$f.cut" && mv "$f.cut" "$f"
run_np 1 ${ARGS//$W\/base/$W\/dmg2} --max-steps 6 --resume >"$W/dmg2.log" 2>&1 || { cat "$W/dmg2.log"; fail "resume past a damaged model.safetensors"; }
grep -q "checkpoint $W/dmg2/epoch_0_step_5 cannot be resumed" "$W/dmg2.log" &&
  grep -q "resumed from $W/dmg2/epoch_0_step_4 at step 4" "$W/dmg2.log" || { cat "$W/dmg2.log"; fail "no fallback past a damaged model.safetensors"; }
compare_exports "$(latest_ckpt "$W/dmg2")" "$(latest_ckpt "$W/intact")" 0 || fail "the fallback run (weights file) differs"
# An --eval-only resume of an older checkpoint moves nothing aside.
"$BIN" ${ARGS//$W\/base/$W\/clean} --eval-only --resume "$W/clean/epoch_0_step_2" \
  --eval-hidden-states-path "$DATA/eval_hidden_states" >"$W/evalonly.log" 2>&1 || { cat "$W/evalonly.log"; fail "--eval-only --resume PATH"; }
[ "$(ls "$W/clean" | grep -c superseded)" -gt 0 ] && fail "--eval-only set checkpoints aside: $(ls "$W/clean")"
# --keep-last 2: after each successful save only the two newest complete checkpoints remain.
cp -r "$W/base" "$W/keep"
run_np 1 ${ARGS//$W\/base/$W\/keep} --max-steps 6 --resume --keep-last 2 >"$W/keep.log" 2>&1 || { cat "$W/keep.log"; fail "--keep-last run"; }
[ "$(cd "$W/keep" && ls -d epoch_*_step_* | sort | tr '\n' ' ')" = "epoch_0_step_4 epoch_0_step_6 " ] || { ls -a "$W/keep"; fail "--keep-last 2 did not keep exactly steps 4 and 6"; }
# run_config.yaml that cannot be written at the start (its temporary name taken by a directory:
# EISDIR, which fails the write as a full disk's ENOSPC does, for root too): exit 2 naming the
# file, before any step, and no empty run_config.yaml left behind.
mkdir -p "$W/rcfail/.run_config.yaml.tmp"
"$BIN" ${ARGS//$W\/base/$W\/rcfail} --max-steps 2 >"$W/rcfail.log" 2>&1; rc=$?
[ $rc -eq 2 ] || { cat "$W/rcfail.log"; fail "unwritable run_config.yaml: exit code $rc, expected 2"; }
[ "$(grep -c "cannot write $W/rcfail/run_config.yaml" "$W/rcfail.log")" -ge 1 ] &&
  [ "$(grep -c -- "---> HINT:" "$W/rcfail.log")" -ge 1 ] ||
  { cat "$W/rcfail.log"; fail "unwritable run_config.yaml: no error naming it with a hint"; }
[ ! -e "$W/rcfail/run_config.yaml" ] || fail "an unwritten run_config.yaml was left behind"
[ "$(ls "$W/rcfail" | grep -c '^epoch_')" -eq 0 ] || fail "a run without its run_config.yaml trained"
echo "save_failures: ok"
