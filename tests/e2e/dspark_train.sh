#!/usr/bin/env bash
# A DSpark draft (the DFlash backbone with a vanilla Markov head of rank 8 and a confidence head)
# trained end to end on toy features in SpecForge's DSpark layout (.ckpt files with input_ids,
# loss_mask, hidden_states and target_last_hidden_states): the loss falls and SpecForge's DSpark
# metrics are reported; 1 and 2 ranks, and micro-batches of 2 and 1, with the same global batch
# reach the same fp32 weights (the heads' units are gathered again for the objective's backward);
# a run stopped at step 4 and resumed ends bitwise equal to an uninterrupted one; the export holds
# the heads under SpecForge's names with the head keys where both engines read them and passes
# check-export; evaluation from the export reports the engine's walk (accept_len) when every
# anchor is sampled and counts the rows it cannot walk otherwise; options a DSpark draft cannot
# honour are refused by name.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
TOY=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/dspark_train"; rm -rf "$W"; mkdir -p "$W/data"

"$PY" "$SRC/benchmarks/data/dflash_features.py" "$TOY" "$W/data" --layers 2 --block-size 4 \
  --dspark || fail "making the DSpark features"
args() {  # OUT
  echo "--target-model-path $W/data/target --draft-model-config $W/data/draft_config.json" \
       "--train-hidden-states-path $W/data/hidden_states --output-dir $1 --max-length 64" \
       "--learning-rate 3e-3 --warmup-ratio 0.1 --log-steps 1 --device cpu --threads 1" \
       "--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4" \
       "--draft-micro-batch-size 2 --save-interval 0 --num-anchors 8 --loss-decay-gamma 4"
}

for np in 1 2; do
  run_np $np $(args "$W/np$np") --num-epochs 1 --max-steps 8 >"$W/np$np.log" 2>&1 ||
    { tail -30 "$W/np$np.log"; fail "DSpark training at $np rank(s)"; }
done
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2")" 1e-5 || fail "1 vs 2 ranks"
run_np 2 $(args "$W/np2mb1") --num-epochs 1 --max-steps 8 --draft-micro-batch-size 1 \
  >"$W/np2mb1.log" 2>&1 || { tail -30 "$W/np2mb1.log"; fail "DSpark training, micro-batch 1"; }
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2mb1")" 1e-5 ||
  fail "micro-batch 2 vs 1"
# ZeRO-3 (the default above) against no sharding: the same weights.
run_np 2 $(args "$W/ddp") --num-epochs 1 --max-steps 8 --sharding-strategy no_shard \
  >"$W/ddp.log" 2>&1 || { tail -30 "$W/ddp.log"; fail "DSpark training, no_shard"; }
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/ddp")" 1e-5 || fail "no_shard"
"$PY" - "$W/np1/metrics.jsonl" "$(latest_ckpt "$W/np1")" "$W/np1/init_ref" <<'PYEOF' || fail "DSpark metrics or export"
import json, os, sys
from safetensors.torch import load_file
rows = [r for r in map(json.loads, open(sys.argv[1])) if "train/loss" in r]
first, last = rows[0], rows[-1]
assert len(rows) == 8, len(rows)
assert last["train/loss"] < first["train/loss"], (first["train/loss"], last["train/loss"])
for k in ("train/acc", "train/ce_loss", "train/l1_loss", "train/confidence_loss",
          "train/confidence_abs_error", "train/teacher_agreement", "train/tau_probabilistic"):
    assert k in last, (k, sorted(last))
# The loss is the alpha-weighted sum of its terms (SpecForge's 0.1, 0.9, 1.0).
want = 0.1 * last["train/ce_loss"] + 0.9 * last["train/l1_loss"] + last["train/confidence_loss"]
assert abs(last["train/loss"] - want) <= 1e-6 * max(1.0, abs(want)), (last["train/loss"], want)
assert 1.0 <= last["train/tau_probabilistic"] <= 5.0, last["train/tau_probabilistic"]
cfg = json.load(open(os.path.join(sys.argv[2], "config.json")))
assert cfg["architectures"] == ["DSparkDraftModel"] and cfg["block_size"] == 4, cfg
assert cfg["markov_rank"] == 8 and cfg["dflash_config"]["markov_rank"] == 8, cfg
assert cfg["enable_confidence_head"] is True, cfg
w = load_file(os.path.join(sys.argv[2], "model.safetensors"))
for n in ("fc.weight", "norm.weight", "layers.1.self_attn.k_norm.weight",
          "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
          "confidence_head.proj.weight", "confidence_head.proj.bias"):
    assert n in w, (n, sorted(w))
assert tuple(w["markov_head.markov_w1.weight"].shape) == (512, 8), w["markov_head.markov_w1.weight"].shape
assert not any(n.startswith(("embed_tokens", "lm_head", "d2t", "t2d")) for n in w), sorted(w)
print(f"loss {first['train/loss']:.3f} -> {last['train/loss']:.3f}, acc {last['train/acc']:.3f}, "
      f"tau {last['train/tau_probabilistic']:.3f}")
PYEOF

out=$("$BIN" check-export "$(latest_ckpt "$W/np1")" --target-model-path "$W/data/target" 2>&1) ||
  { echo "$out"; fail "check-export on the DSpark export"; }
grep -q " 0 ERROR" <<<"$out" || { echo "$out"; fail "check-export found errors"; }

# Evaluation from the export (--init-checkpoint reads the heads back) walks each reply as the
# engine drafts it (block positions 0..3 propose, each after the one before).
check_engine_walk "$W" "$(latest_ckpt "$W/np1")" 5
grep -q "eval/tau_probabilistic" "$W/eval8/metrics.jsonl" || fail "no eval metrics"

# Stopped at step 4 and resumed to 8: bitwise the uninterrupted run (1 rank).
run_np 1 $(args "$W/part") --num-epochs 1 --max-steps 4 >"$W/part1.log" 2>&1 ||
  { tail -30 "$W/part1.log"; fail "first half"; }
run_np 1 $(args "$W/part") --num-epochs 1 --max-steps 8 --resume >"$W/part2.log" 2>&1 ||
  { tail -30 "$W/part2.log"; fail "resumed half"; }
grep -q "resumed from .*step_4" "$W/part2.log" || fail "did not resume from step 4"
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/part")" 0 || fail "resume is not bitwise exact"

# --optimizer muon on the DSpark draft (docs/usage.md "Optimizers": the Markov factors go to
# AdamW at Muon's learning rate, the backbone's matrices to Muon): 1 and 2 ranks, the same
# per-step losses (within 1e-2, the bf16 Newton-Schulz of another summation order).
for np in 1 2; do
  run_np $np $(args "$W/muon$np") --num-epochs 1 --max-steps 8 --optimizer muon \
    >"$W/muon$np.log" 2>&1 || { tail -30 "$W/muon$np.log"; fail "DSpark under Muon at $np rank(s)"; }
done
"$PY" - "$W/muon1/metrics.jsonl" "$W/muon2/metrics.jsonl" "$W/np1/metrics.jsonl" <<'PYEOF' ||
import json, math, sys
a, b, adamw = ([r["train/loss"] for r in map(json.loads, open(p)) if "train/loss" in r]
               for p in sys.argv[1:4])
assert len(a) == len(b) == 8 and all(math.isfinite(x) for x in a), (a, b)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst < 1e-2, ("1 vs 2 ranks", worst)
assert max(abs(x - y) for x, y in zip(a[1:], adamw[1:])) > 1e-4, "Muon trained what AdamW did"
print(f"DSpark under Muon: 1 vs 2 ranks within {worst:.1e}")
PYEOF
  fail "DSpark under Muon"

# Features without target_last_hidden_states cannot feed the L1 term: a named error.
"$PY" "$SRC/benchmarks/data/dflash_features.py" "$TOY" "$W/nolast" --layers 2 --block-size 4 ||
  fail "making DFlash features"
expect_usage_error "features without target_last_hidden_states" "$BIN" $(args "$W/bad") \
  --train-hidden-states-path "$W/nolast/hidden_states" --max-steps 1
grep -q "target_last_hidden_states" <<<"$out" || { echo "$out" | tail -5; fail "the error does not name the key"; }

# Options a DSpark draft cannot honour are refused by name.
for bad in "--packing" "--sp-ulysses-size 2" "--ttt-length 5" "--block-loss-type dpace"; do
  expect_usage_error "$bad" "$BIN" $(args "$W/bad") --max-steps 1 $bad
  grep -q -- "${bad%% *}" <<<"$out" || { echo "$out" | tail -5; fail "$bad: the error does not name it"; }
done
echo PASS
