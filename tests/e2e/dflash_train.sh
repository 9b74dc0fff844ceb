#!/usr/bin/env bash
# A DFlash draft trained end to end on toy features in SpecForge's DFlash layout (.ckpt files with
# input_ids, loss_mask, hidden_states; made here from the toy EAGLE3 features): the loss falls and
# the simulated acceptance is reported; 1 and 2 ranks, and micro-batches of 2 and 1, with the same
# global batch reach the same fp32 weights; a run stopped at step 4 and resumed ends bitwise equal
# to an uninterrupted one (anchors are drawn per sample from the seed, not from a generator's
# state); the export carries SpecForge's names and the block keys; options a block draft cannot
# honour are refused by name.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
TOY=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/dflash_train"; rm -rf "$W"; mkdir -p "$W/data"

# The toy features in the DFlash layout, the toy target claiming 8 layers (the features stand
# for layers 1, 3 and 5) and a 2-layer DFlash draft over it (hidden 64, vocabulary 512, block 4).
"$PY" "$SRC/benchmarks/data/dflash_features.py" "$TOY" "$W/data" --layers 2 --block-size 4 ||
  fail "making the DFlash features"
args() {  # OUT
  echo "--target-model-path $W/data/target --draft-model-config $W/data/draft_config.json" \
       "--train-hidden-states-path $W/data/hidden_states --output-dir $1 --max-length 64" \
       "--learning-rate 3e-3 --warmup-ratio 0.1 --log-steps 1 --device cpu --threads 1" \
       "--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4" \
       "--draft-micro-batch-size 2 --save-interval 0 --num-anchors 8"
}

for np in 1 2; do
  run_np $np $(args "$W/np$np") --num-epochs 1 --max-steps 8 >"$W/np$np.log" 2>&1 ||
    { tail -30 "$W/np$np.log"; fail "DFlash training at $np rank(s)"; }
done
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2")" 1e-5 || fail "1 vs 2 ranks"
# The step normalises over its global batch: micro-batches of 1 (accumulation 2) train the same.
run_np 2 $(args "$W/np2mb1") --num-epochs 1 --max-steps 8 --draft-micro-batch-size 1 \
  >"$W/np2mb1.log" 2>&1 || { tail -30 "$W/np2mb1.log"; fail "DFlash training, micro-batch 1"; }
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2mb1")" 1e-5 ||
  fail "micro-batch 2 vs 1"
"$PY" - "$W/np1/metrics.jsonl" "$(latest_ckpt "$W/np1")" <<'PYEOF' || fail "DFlash metrics or export"
import json, os, sys
from safetensors.torch import load_file
rows = [r for r in map(json.loads, open(sys.argv[1])) if "train/loss" in r]
first, last = rows[0], rows[-1]
assert len(rows) == 8, len(rows)
assert last["train/loss"] < first["train/loss"], (first["train/loss"], last["train/loss"])
for k in ("train/acc", "train/accept_len_all_anchors", "train/blocks"):
    assert k in last, (k, sorted(last))
assert 1.0 <= last["train/accept_len_all_anchors"] <= 4.0, last["train/accept_len_all_anchors"]
cfg = json.load(open(os.path.join(sys.argv[2], "config.json")))
assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4, cfg
assert cfg["dflash_config"]["mask_token_id"] == 511, cfg
names = set(load_file(os.path.join(sys.argv[2], "model.safetensors")))
for n in ("fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight",
          "layers.0.mlp.down_proj.weight"):
    assert n in names, (n, sorted(names))
assert not any(n.startswith(("embed_tokens", "lm_head", "d2t", "t2d")) for n in names), sorted(names)
print(f"loss {first['train/loss']:.3f} -> {last['train/loss']:.3f}, acc {last['train/acc']:.3f}, "
      f"accept_len over all anchors {last['train/accept_len_all_anchors']:.3f}")
PYEOF

# The export passes check-export against the target (the engines' rules for DFlash).
out=$("$BIN" check-export "$(latest_ckpt "$W/np1")" --target-model-path "$W/data/target" 2>&1) ||
  { echo "$out"; fail "check-export on the DFlash export"; }
grep -q " 0 ERROR" <<<"$out" || { echo "$out"; fail "check-export found errors"; }

# Evaluation walks each reply as the engine drafts it (block positions 1..3 propose).
check_engine_walk "$W" "$(latest_ckpt "$W/np1")" 4

# Stopped at step 4 and resumed to 8: bitwise the uninterrupted run (1 rank).
run_np 1 $(args "$W/part") --num-epochs 1 --max-steps 4 >"$W/part1.log" 2>&1 ||
  { tail -30 "$W/part1.log"; fail "first half"; }
run_np 1 $(args "$W/part") --num-epochs 1 --max-steps 8 --resume >"$W/part2.log" 2>&1 ||
  { tail -30 "$W/part2.log"; fail "resumed half"; }
grep -q "resumed from .*step_4" "$W/part2.log" || fail "did not resume from step 4"
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/part")" 0 || fail "resume is not bitwise exact"

# Options a DFlash draft cannot honour are refused by name.
for bad in "--packing" "--sp-ulysses-size 2" "--ttt-length 5" "--lora-rank 4" \
           "--dspark-l1-loss-alpha 0.5"; do
  expect_usage_error "$bad" "$BIN" $(args "$W/bad") --max-steps 1 $bad
  grep -q -- "${bad%% *}" <<<"$out" || { echo "$out" | tail -5; fail "$bad: the error does not name it"; }
done
echo PASS
