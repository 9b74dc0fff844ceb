#!/usr/bin/env bash
# --stream end to end (docs/data.md "Streaming") on the toy EAGLE3 features, producers being
# apps/spool/fsdp_spool.py replays of the offline dump:
# - fed in the order the offline sampler would draw (torch.randperm of --seed), a stream trains
#   bitwise what the offline run trains, at 1 and 2 ranks;
# - the trainer SIGKILLed after step 13 and resumed from its step-12 checkpoint while the producer
#   goes on: bitwise the uninterrupted run (the samples of step 13 trained again, none of steps
#   1-12: they were acknowledged and deleted), the spool drained at the end; at 1 and 2 ranks;
# - a disk budget of 10 samples with a producer that never pauses: the spool (sampled every
#   few ms) never holds more than the budget, the budget's early checkpoints acknowledge, and the
#   run is still bitwise the uninterrupted one; at 1 and 2 ranks;
# - --stream-uses 2 (windows of 8): 48 steps from 96 samples, windows acknowledged whole, a
#   SIGKILL resumed bitwise;
# - --packing: bitwise the offline packed run; --total-steps before the end: only what was
#   trained is acknowledged;
# - a held-out set evaluated every 6 steps and --save-best-by, as offline;
# - a producer SIGKILLed mid-stream and restarted (--resume), with a truncated arrival, and three
#   producers at once: every sample arrives once, the bad one is skipped with a warning naming
#   it, the run drains the spool and ends at END_OF_STREAM;
# - refusals: --stream without --total-steps or with --num-epochs 2, a stream knob without
#   --stream, another run's spool, an offline dump given --stream (nothing deleted); the YAML
#   keys alike.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/stream_train"; rm -rf "$W"; mkdir -p "$W"
SPOOL_PY="$SRC/apps/spool/fsdp_spool.py"
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --num-epochs 1 --total-steps 24 --seed 3"
# 96 training samples, 4 per step: 24 steps.
# The streams read the offline run's vocabulary mapping (an offline run counts all 96 samples; a
# stream counts its first --stream-start-samples arrivals).
stream_args() {  # SPOOL OUT
  echo "--target-model-path $DATA/target --draft-model-config $DATA/draft_config.json" \
       "--train-hidden-states-path $1 --stream --stream-start-samples 8 --cache-dir $W/cache" \
       "--vocab-mapping-path $W/vocab.pt" \
       "--output-dir $2 --max-length 64 --ttt-length 3 --learning-rate 1e-3" \
       "--warmup-ratio 0.1 --log-steps 1 --device cpu --threads 1"
}
# The offline sampler's order for epoch 0: torch.randperm(96) from a generator seeded with 3.
"$PY" -c "import torch, json; g = torch.Generator(); g.manual_seed(3); print(json.dumps(torch.randperm(96, generator=g).tolist()))" \
  >"$W/order.json" || fail "the offline order"
replay() {  # SPOOL ARGS...: a producer of the training dump in the offline order
  local spool="$1"; shift
  "$PY" "$SPOOL_PY" replay --source "$DATA/hidden_states" --spool "$spool" --order "$W/order.json" "$@"
}
drained() {  # SPOOL: no sample left, the ledger ended with 96 arrivals, all acknowledged
  "$PY" - "$1" <<'PYEOF'
import os, sys
spool = sys.argv[1]
left = [n for n in os.listdir(spool) if n.endswith(".ckpt")]
assert not left, left
lines = open(os.path.join(spool, ".spool", "ledger")).read().splitlines()
arrivals = [l for l in lines if l.startswith("A ")]
assert len(arrivals) == len({l.split()[1] for l in arrivals}) == 96, len(arrivals)
assert "E 96" in lines, lines[-3:]
assert lines[-1] == "K 96", lines[-1]
PYEOF
}

for np in 1 2; do
  run_np $np $(train_args "$DATA" "$W/offline$np") $COMMON >"$W/offline$np.log" 2>&1 ||
    { tail -30 "$W/offline$np.log"; fail "offline run at $np rank(s)"; }
  [ -f "$W/vocab.pt" ] || "$PY" - "$(latest_ckpt "$W/offline$np")" "$W/vocab.pt" <<'PYEOF' || fail "vocab mapping"
import sys, torch
from safetensors.torch import load_file
t = load_file(sys.argv[1] + "/model.safetensors")
torch.save({"d2t": t["d2t"], "t2d": t["t2d"]}, sys.argv[2])
PYEOF
  mkdir -p "$W/spool$np"
  replay "$W/spool$np" --end >"$W/producer$np.log" 2>&1 &
  producer=$!
  run_np $np $(stream_args "$W/spool$np" "$W/stream$np") $COMMON >"$W/stream$np.log" 2>&1 ||
    { tail -30 "$W/stream$np.log"; fail "streaming run at $np rank(s)"; }
  wait $producer || { cat "$W/producer$np.log"; fail "producer $np"; }
  compare_exports "$(latest_ckpt "$W/offline$np")" "$(latest_ckpt "$W/stream$np")" 0 ||
    fail "the stream at $np rank(s) is not bitwise the offline run on the same order"
  drained "$W/spool$np" || fail "spool $np not drained"
  grep -q "24 optimizer steps" "$W/stream$np.log" || fail "stream $np: not 24 steps"
done
echo "stream == offline on the same order, bitwise, at 1 and 2 ranks; spools drained"

# SIGKILL of the trainer (the last rank, after step 13; the checkpoint of step 12 acknowledged
# 48 samples), resumed while a paced producer keeps publishing; then a budget of 10 samples with
# a producer that never pauses. At 1 and 2 ranks.
bytes=$(find "$DATA/hidden_states" -name '*.ckpt' -printf '%s\n' | sort -n | tail -n 1)
budget_gb=$("$PY" -c "print(10 * $bytes / 2**30)")
budget=$((10 * bytes))
for np in 1 2; do
  mkdir -p "$W/spool_kill$np"
  replay "$W/spool_kill$np" --every 0.05 --end >"$W/producer_kill$np.log" 2>&1 &
  producer=$!
  FSDP_TEST_KILL_AT_STEP=13 FSDP_TEST_KILL_RANK=$((np - 1)) run_np $np \
    $(stream_args "$W/spool_kill$np" "$W/kill$np") $COMMON --save-steps 12 >"$W/kill$np-1.log" 2>&1 &&
    { tail -20 "$W/kill$np-1.log"; fail "the run to be killed exited 0"; }
  "$PY" - "$W/spool_kill$np" <<'PYEOF' || fail "acknowledgement before the kill"
import os, sys
lines = open(os.path.join(sys.argv[1], ".spool", "ledger")).read().splitlines()
assert "K 48" in lines, [l for l in lines if l.startswith("K")]
gone = [l.split()[1] for l in lines if l.startswith("A ")][:48]
assert not any(os.path.exists(os.path.join(sys.argv[1], n)) for n in gone)
PYEOF
  run_np $np $(stream_args "$W/spool_kill$np" "$W/kill$np") $COMMON --save-steps 12 --resume auto \
    >"$W/kill$np-2.log" 2>&1 || { tail -30 "$W/kill$np-2.log"; fail "resumed stream at $np rank(s)"; }
  wait $producer || { cat "$W/producer_kill$np.log"; fail "paced producer"; }
  grep -q "resumed from .*step_12" "$W/kill$np-2.log" || fail "did not resume from step 12"
  compare_exports "$(latest_ckpt "$W/stream$np")" "$(latest_ckpt "$W/kill$np")" 0 ||
    fail "the resumed stream at $np rank(s) is not bitwise the uninterrupted one"
  drained "$W/spool_kill$np" || fail "spool not drained after the resume"

  mkdir -p "$W/spool_budget$np"
  # The spool's size every 2 ms (fsdp_spool.used_bytes: regular files, each inode once).
  "$PY" "$SPOOL_PY" watch "$W/spool_budget$np" --out "$W/budget_peak$np" &
  monitor=$!
  replay "$W/spool_budget$np" --end >"$W/producer_budget$np.log" 2>&1 &
  producer=$!
  run_np $np $(stream_args "$W/spool_budget$np" "$W/budget$np") $COMMON \
    --stream-max-gb "$budget_gb" --keep-last 2 >"$W/budget$np.log" 2>&1 ||
    { tail -30 "$W/budget$np.log"; fail "stream under a budget at $np rank(s)"; }
  wait $producer || { cat "$W/producer_budget$np.log"; fail "producer under the budget"; }
  touch "$W/spool_budget$np/.spool/done"
  wait $monitor
  peak=$(cat "$W/budget_peak$np")
  [ "$peak" -le "$budget" ] || fail "the spool held $peak bytes, over the budget of $budget"
  early=$(grep -c "to acknowledge the samples consumed" "$W/budget$np.log")
  [ "$early" -ge 3 ] || fail "the budget asked for no early checkpoints"
  drained "$W/spool_budget$np" || fail "spool not drained under the budget"
  compare_exports "$(latest_ckpt "$W/stream$np")" "$(latest_ckpt "$W/budget$np")" 0 ||
    fail "the stream under a budget is not bitwise the uninterrupted one"
  echo "$np rank(s): SIGKILL + --resume auto bitwise the uninterrupted stream; budget $budget bytes" \
    "(10 samples): peak $peak bytes, $early early checkpoints, bitwise the unbudgeted run"
done

# --stream-uses 2 in windows of 8: 192 positions, 48 steps; a SIGKILL after step 13 resumed from
# step 12 (48 positions: 3 whole windows, 24 samples acknowledged) is bitwise the uninterrupted run.
USES="--stream-uses 2 --stream-replay-window 8"
COMMON2="${COMMON/--total-steps 24/--total-steps 48}"
mkdir -p "$W/spool_uses" "$W/spool_uses_kill"
replay "$W/spool_uses" --end >/dev/null 2>&1 &
producer=$!
run_np 1 $(stream_args "$W/spool_uses" "$W/uses") $COMMON2 $USES >"$W/uses.log" 2>&1 ||
  { tail -30 "$W/uses.log"; fail "--stream-uses 2"; }
wait $producer
grep -q "48 optimizer steps" "$W/uses.log" || fail "--stream-uses 2: not 48 steps"
replay "$W/spool_uses_kill" --every 0.02 --end >/dev/null 2>&1 &
producer=$!
FSDP_TEST_KILL_AT_STEP=13 FSDP_TEST_KILL_RANK=0 run_np 1 $(stream_args "$W/spool_uses_kill" "$W/uses_kill") \
  $COMMON2 $USES --save-steps 12 >"$W/uses_kill1.log" 2>&1 && fail "the --stream-uses run to be killed exited 0"
grep -q "^K 24$" "$W/spool_uses_kill/.spool/ledger" || fail "--stream-uses 2: 24 samples not acknowledged at step 12"
run_np 1 $(stream_args "$W/spool_uses_kill" "$W/uses_kill") $COMMON2 $USES --save-steps 12 --resume auto \
  >"$W/uses_kill2.log" 2>&1 || { tail -30 "$W/uses_kill2.log"; fail "--stream-uses 2 resumed"; }
wait $producer
compare_exports "$(latest_ckpt "$W/uses")" "$(latest_ckpt "$W/uses_kill")" 0 ||
  fail "--stream-uses 2: the resumed run is not bitwise the uninterrupted one"
drained "$W/spool_uses_kill" || fail "--stream-uses 2: spool not drained"
echo "--stream-uses 2: 48 steps; SIGKILL + resume bitwise; windows acknowledged whole"

# --packing (global batch 8 of micro-batches of 2, packed) at 2 ranks: the stream in the offline
# order is bitwise the offline packed run; --total-steps 3 ends the run before the stream does:
# what it trained is acknowledged, the rest stays in the spool.
PACK="--packing --draft-global-batch-size 8 --total-steps 12"
run_np 2 $(train_args "$DATA" "$W/pack_offline") $COMMON $PACK >"$W/pack_offline.log" 2>&1 ||
  { tail -30 "$W/pack_offline.log"; fail "offline packed run"; }
mkdir -p "$W/spool_pack"
replay "$W/spool_pack" --end >/dev/null 2>&1 &
producer=$!
run_np 2 $(stream_args "$W/spool_pack" "$W/pack") $COMMON $PACK >"$W/pack.log" 2>&1 ||
  { tail -30 "$W/pack.log"; fail "packed stream"; }
wait $producer
compare_exports "$(latest_ckpt "$W/pack_offline")" "$(latest_ckpt "$W/pack")" 0 ||
  fail "the packed stream is not bitwise the offline packed run"
drained "$W/spool_pack" || fail "packed spool not drained"
mkdir -p "$W/spool_short"
replay "$W/spool_short" --end >/dev/null 2>&1 &
producer=$!
run_np 1 $(stream_args "$W/spool_short" "$W/short") ${COMMON/--total-steps 24/--total-steps 3} \
  >"$W/short.log" 2>&1 || { tail -30 "$W/short.log"; fail "stream ending at --total-steps"; }
wait $producer
case "$(latest_ckpt "$W/short")" in *_step_3) ;; *) fail "not ended at step 3: $(ls "$W/short")" ;; esac
[ "$(grep -c '^K ' "$W/spool_short/.spool/ledger")" -ge 1 ] && [ "$(grep '^K ' "$W/spool_short/.spool/ledger" | tail -n 1)" = "K 12" ] ||
  fail "--total-steps 3: not 12 samples acknowledged: $(grep '^K ' "$W/spool_short/.spool/ledger")"
[ "$(find "$W/spool_short" -maxdepth 1 -name '*.ckpt' | wc -l)" -eq 84 ] || fail "--total-steps 3: the untrained samples were not kept"
echo "--packing: bitwise the offline packed run; --total-steps 3: 12 samples acknowledged, 84 kept"

# Evaluation on a fixed held-out set every 6 steps and the best checkpoint, as offline.
mkdir -p "$W/spool_eval"
replay "$W/spool_eval" --every 0.01 --end >/dev/null 2>&1 &
producer=$!
run_np 1 $(stream_args "$W/spool_eval" "$W/eval") $COMMON --eval-hidden-states-path "$DATA/eval_hidden_states" \
  --eval-steps 6 --save-best-by eval/loss --keep-last 1 >"$W/eval.log" 2>&1 ||
  { tail -30 "$W/eval.log"; fail "stream with evaluation"; }
wait $producer
"$PY" - "$W/eval" <<'PYEOF' || fail "evaluation and the best checkpoint of a stream"
import json, os, sys
out = sys.argv[1]
evals = [(r["step"], r["eval/loss"]) for r in map(json.loads, open(f"{out}/metrics.jsonl")) if "eval/loss" in r]
assert [s for s, _ in evals] == [6, 12, 18, 24], evals
best = min(evals, key=lambda e: e[1])
rec = json.load(open(f"{out}/best.json"))
assert rec["step"] == best[0] and os.readlink(f"{out}/best") == rec["checkpoint"], (rec, evals)
assert os.path.isfile(f"{out}/best/COMPLETE"), "the best checkpoint is not complete"
print("stream evaluations:", ", ".join(f"{s}:{v:.4f}" for s, v in evals), "| best:", rec["checkpoint"])
PYEOF
drained "$W/spool_eval" || fail "spool not drained with evaluation"

# A producer killed mid-stream and restarted, a truncated arrival, three producers at once.
mkdir -p "$W/spool_many"
"$PY" -c "import json; o = json.load(open('$W/order.json')); [json.dump(o[k::3], open(f'$W/order{k}.json', 'w')) for k in range(3)]"
for k in 0 1 2; do
  extra=""; [ $k -eq 1 ] && extra="--truncate 5"
  "$PY" "$SPOOL_PY" replay --source "$DATA/hidden_states" --spool "$W/spool_many" \
    --order "$W/order$k.json" --prefix "p$k-" --every 0.08 $extra >"$W/many$k.log" 2>&1 &
  eval "prod$k=\$!"
done
run_np 2 $(stream_args "$W/spool_many" "$W/many") $COMMON >"$W/many.log" 2>&1 &
trainer=$!
# Producer 0 dies (SIGKILL) once 6 of its samples arrived, and is restarted.
for _ in $(seq 1 600); do
  [ "$(ls "$W/spool_many" | grep -c '^p0-')" -ge 6 ] && break
  sleep 0.05
done
{ kill -9 $prod0; wait $prod0; } 2>/dev/null
"$PY" "$SPOOL_PY" replay --source "$DATA/hidden_states" --spool "$W/spool_many" \
  --order "$W/order0.json" --prefix "p0-" --resume >"$W/many0b.log" 2>&1 || { cat "$W/many0b.log"; fail "restarted producer"; }
wait $prod1 || fail "producer 1"
wait $prod2 || fail "producer 2"
"$PY" "$SPOOL_PY" end "$W/spool_many"
wait $trainer || { tail -30 "$W/many.log"; fail "stream with several producers"; }
drained "$W/spool_many" || fail "spool not drained with several producers"
grep "skipped a bad sample" "$W/many.log" >"$W/many.bad" || true
[ "$(wc -l <"$W/many.bad")" -eq 1 ] || { tail -20 "$W/many.log"; fail "the truncated arrival was not skipped once"; }
grep -q "p1-00000005_" "$W/many.bad" || fail "the warning does not name the truncated file: $(cat "$W/many.bad")"
[ -z "$(find "$W/spool_many" -maxdepth 1 -name '*.tmp')" ] || fail "a dead producer's temporary file was left"
echo "3 producers (one SIGKILLed and restarted), a truncated arrival skipped: 96 arrivals once each"

# Refusals.
expect_usage_error "--stream without --total-steps" "$BIN" $(stream_args "$W/spool1" "$W/r1") \
  --mixed-precision fp32
grep -q -- "--total-steps" <<<"$out" || fail "no --total-steps in: $out"
expect_usage_error "--stream with --num-epochs 2" "$BIN" $(stream_args "$W/spool1" "$W/r2") \
  --total-steps 4 --num-epochs 2
grep -q -- "--stream-uses" <<<"$out" || fail "no --stream-uses in: $out"
expect_usage_error "--stream-max-gb without --stream" "$BIN" $(train_args "$DATA" "$W/r3") \
  --stream-max-gb 1
grep -q -- "--stream" <<<"$out" || fail "no --stream in: $out"
expect_usage_error "another run's spool" "$BIN" $(stream_args "$W/spool1" "$W/r4") $COMMON
grep -q "stream1" <<<"$out" || fail "the other run is not named: $out"
n_before=$(find "$DATA/hidden_states" -name '*.ckpt' | wc -l)
expect_usage_error "--stream on an offline dump" "$BIN" $(train_args "$DATA" "$W/r7") $COMMON --stream
grep -q "not a spool" <<<"$out" || fail "the offline dump was not refused by name: $out"
[ "$(find "$DATA/hidden_states" -name '*.ckpt' | wc -l)" -eq "$n_before" ] || fail "the dump lost files"
[ ! -e "$DATA/hidden_states/.spool" ] || fail "the dump was made a spool"
# The same keys in a --config file.
printf 'stream: true\nstream_max_gb: 1\n' >"$W/stream.yaml"
expect_usage_error "YAML stream without total_steps" "$BIN" --config "$W/stream.yaml" \
  $(stream_args "$W/spool1" "$W/r5" | sed 's/--stream //')
grep -q -- "--total-steps" <<<"$out" || fail "YAML: no --total-steps in: $out"
printf 'stream_uses: 2\n' >"$W/uses.yaml"
expect_usage_error "YAML stream_uses without stream" "$BIN" --config "$W/uses.yaml" $(train_args "$DATA" "$W/r6")
grep -q -- "--stream" <<<"$out" || fail "YAML: no --stream in: $out"
echo "refusals named"
