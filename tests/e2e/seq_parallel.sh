#!/usr/bin/env bash
# Sequence parallelism end to end (docs/usage.md "Sequence parallelism"): Ulysses groups of 2
# and 4 ranks, and 2 data-parallel x 2 sequence-parallel, equal the runs without it in fp32:
# every per-step metric (losses, accuracies, acceptance, gradient norm) within 1e-6 relative,
# the weights after 3 steps within 1e-6 relative L2, on samples of 2 to 90 tokens (truncated at
# 64, so most lengths do not divide the group size and slices end in padding) with a one-token
# sample among them (shorter than the group: some ranks hold only padding), a draft with GQA
# (8 heads over 4 key/value heads). Evaluation too, the per-token normalisation with the LK
# lambda objective (their normalisers are summed over the group), activation checkpointing with
# the chunked head, native shards read one slice per rank. Bad layouts exit 2.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data sp_varied --num-samples 40 --min-len 2 --max-len 90 --samples-per-dir 8 --seed 5)
W="$BUILD/e2e_work/seq_parallel"; rm -rf "$W"; mkdir -p "$W"
if [ ! -f "$DATA/hidden_states/rows_0-8/single_token.ckpt" ]; then
  "$PY" - "$DATA/hidden_states/rows_0-8/single_token.ckpt" <<'PYEOF' || fail "writing a one-token sample"
import sys, torch
H = 64
torch.save({"input_ids": torch.tensor([5]), "loss_mask": torch.tensor([1]),
            "hidden_state": torch.randn(1, 1, H).bfloat16(),
            "aux_hidden_state": torch.randn(1, 1, 3 * H).bfloat16()}, sys.argv[1])
PYEOF
fi
# The toy draft with 8 attention heads over 4 key/value heads (head_dim 8).
"$PY" - "$DATA/draft_config.json" "$W/draft_gqa.json" <<'PYEOF' || fail "writing the GQA draft config"
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PYEOF
COMMON="--draft-model-config $W/draft_gqa.json --mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --save-interval 0 --num-epochs 1 --max-steps 3"

same_run() {  # same_run A B PREFIX: per-step (or evaluation) metrics and exported weights agree
  "$PY" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" <<'PYEOF' || return 1
import json, sys
prefix = sys.argv[3]
def load(path):
    return [r for r in map(json.loads, open(path)) if prefix + "/loss" in r]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) >= 1, (len(a), len(b))
worst, names = 0.0, 0
for x, y in zip(a, b):
    for k, v in x.items():
        if k.startswith(prefix + "/") and k != prefix + "/epoch":
            assert k in y, k
            d = abs(v - y[k]) / max(1.0, abs(v))
            assert d <= 1e-6, (k, v, y[k])
            worst, names = max(worst, d), names + 1
print(f"{prefix}: {names} values agree (worst relative difference {worst:.2e})")
PYEOF
  [ "$3" = eval ] || compare_exports "$(latest_ckpt "$1")" "$(latest_ckpt "$2")" 1e-6
}

run() {  # run NAME NP ARGS...
  local name="$1" np="$2"; shift 2
  run_np "$np" $(train_args "$DATA" "$W/$name") $COMMON "$@" >"$W/$name.log" 2>&1 ||
    { tail -20 "$W/$name.log"; fail "$name ($np ranks: $*)"; }
}

run sp1 1
run sp2 2 --sp-ulysses-size 2
same_run "$W/sp1" "$W/sp2" train || fail "SP 2 != SP 1"
run sp4 4 --sp-ulysses-size 4
same_run "$W/sp1" "$W/sp4" train || fail "SP 4 != SP 1"
run dp2 2
run dp2sp2 4 --sp-ulysses-size 2
same_run "$W/dp2" "$W/dp2sp2" train || fail "DP 2 x SP 2 != DP 2"
# Per-token normalisation and LK lambda: their normalisers are the sample's, over the group.
run tok1 1 --loss-normalization tokens --lk-loss-type lambda
run tok2 2 --loss-normalization tokens --lk-loss-type lambda --sp-ulysses-size 2
same_run "$W/tok1" "$W/tok2" train || fail "SP 2 != SP 1 (tokens, LK lambda)"
# Activation checkpointing (the layer and its all-to-alls recomputed in backward) and the
# chunked head.
run ac1 1 --activation-checkpointing --head-chunk-rows 5
run ac2 2 --activation-checkpointing --head-chunk-rows 5 --sp-ulysses-size 2
same_run "$W/ac1" "$W/ac2" train || fail "SP 2 != SP 1 (activation checkpointing, chunked head)"
# Evaluation of the trained weights, held-out set.
EVAL="--eval-hidden-states-path $DATA/eval_hidden_states --eval-only --init-checkpoint $(latest_ckpt "$W/sp1")"
run ev1 1 $EVAL
run ev4 4 $EVAL --sp-ulysses-size 4
same_run "$W/ev1" "$W/ev4" eval || fail "evaluation at SP 4 != SP 1"

# Native shards: each rank reads its slice's hidden-state rows alone; the same step as from .ckpt,
# with well under the bytes of the whole samples per rank.
"$BIN" convert --input "$DATA/hidden_states" --output "$W/native" >"$W/convert.log" 2>&1 ||
  { tail -20 "$W/convert.log"; fail "convert to native shards"; }
run_native() {  # run_native NAME NP ARGS...
  local name="$1" np="$2"; shift 2
  run_np "$np" $(train_args "$DATA" "$W/$name" | sed "s#$DATA/hidden_states#$W/native#") \
    $COMMON "$@" >"$W/$name.log" 2>&1 || { tail -20 "$W/$name.log"; fail "$name ($np ranks: $*)"; }
}
run_native nat1 1
run_native nat2 2 --sp-ulysses-size 2
same_run "$W/sp2" "$W/nat2" train || fail "SP 2 on native shards != SP 2 on .ckpt"
"$PY" - "$W/nat1/metrics.jsonl" "$W/nat2/metrics.jsonl" <<'PYEOF' || fail "SP 2 ranks read whole samples"
import json, sys
def read(path):
    return sum(r["perf/read_mib_per_step"] for r in map(json.loads, open(path)) if "perf/read_mib_per_step" in r)
whole, part = read(sys.argv[1]), read(sys.argv[2])
assert whole > 0 and part < 0.75 * whole, (whole, part)
print(f"native: rank 0 read {part:.3f} MiB at SP 2, {whole:.3f} MiB at SP 1")
PYEOF

# Layouts that cannot work stop at start-up naming the flag.
A="$(train_args "$DATA" "$W/bad") $COMMON"
expect_usage_error "3 ranks, SP 2" "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n 3 "$BIN" $A --sp-ulysses-size 2
grep -q -- "--sp-ulysses-size" <<<"$out" || { echo "$out"; fail "the refusal does not name --sp-ulysses-size"; }
expect_usage_error "micro-batch 2" "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n 2 "$BIN" $A --sp-ulysses-size 2 --draft-micro-batch-size 2
grep -q -- "--draft-micro-batch-size" <<<"$out" || { echo "$out"; fail "the refusal does not name the micro-batch"; }
expect_usage_error "packing" "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n 2 "$BIN" $A --sp-ulysses-size 2 --packing
grep -q -- "--packing" <<<"$out" || { echo "$out"; fail "the refusal does not name --packing"; }
# The toy draft has 2 heads over 1 key/value head: no group of 2 can split them.
expect_usage_error "heads" "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n 2 "$BIN" $A --sp-ulysses-size 2 --draft-model-config "$DATA/draft_config.json"
grep -q -- "key/value heads" <<<"$out" || { echo "$out"; fail "the refusal does not name the heads"; }
expect_usage_error "ring" "$BIN" $A --sp-ring-size 2
grep -q -- "--sp-ring-size" <<<"$out" || { echo "$out"; fail "the refusal does not name --sp-ring-size"; }

# memory-plan: the estimate per length and size; 128k tokens of the llama3-8B draft do not fit
# one H200 without sequence parallelism and do at size 2 (docs/benchmarks.md).
plan=$("$BIN" memory-plan --draft-model-config "$SRC/configs/models/llama3-8B-eagle3.json" \
  --max-length 2048,131072 --sp-sizes 1,2 --overhead-gib 0.8) || fail "memory-plan"
"$PY" - "$plan" <<'PYEOF' || fail "memory-plan's table"
import sys
rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
        for l in sys.argv[1].splitlines() if l.startswith("| ") and l.split("|")[1].strip().isdigit()}
assert rows["2048"][-1] == "1", rows
assert rows["131072"][0].endswith("(no)") and rows["131072"][-1] == "2", rows
assert 18.0 <= float(rows["2048"][0]) <= 19.5, rows  # the measured 18.8 GiB
print("memory-plan:", rows)
PYEOF
expect_usage_error "memory-plan without a config" "$BIN" memory-plan --draft-model-config "$W/missing.json"
echo PASS
