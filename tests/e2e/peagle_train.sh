#!/usr/bin/env bash
# A P-EAGLE draft trained end to end on the toy EAGLE3 features (docs/model.md "P-EAGLE"): the
# loss falls and SpecForge's per-depth accuracies are reported; 1, 2 and 4 ranks with the same
# global batch, every sharding strategy and CPU offload at 2 ranks reach the same fp32 weights (the
# depth rows are drawn per sample from the seed); a run SIGKILLed after step 5 and resumed from its
# step-4 checkpoint ends bitwise equal to an uninterrupted one, and a 1-rank state resumed on 2
# ranks equal within tolerance; evaluation walks each reply as vLLM's parallel drafting does (accept_len);
# the export is the layout vLLM's EAGLE3 loader reads with parallel_drafting (mask_hidden, the
# trained embedding, mask_token_id) and passes check-export; options P-EAGLE cannot honour are
# refused by name.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/peagle_train"; rm -rf "$W"; mkdir -p "$W"
"$PY" - "$DATA/draft_config.json" "$W/peagle.json" "$W/nomask.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(architectures=["PEagleDraftModel"], num_hidden_layers=2, mask_token_id=511)
json.dump(c, open(sys.argv[2], "w"), indent=1)
del c["mask_token_id"]
json.dump(c, open(sys.argv[3], "w"), indent=1)
PYEOF
args() {  # OUT
  echo "--target-model-path $DATA/target --draft-model-config $W/peagle.json" \
       "--train-hidden-states-path $DATA/hidden_states --cache-dir $DATA/cache --output-dir $1" \
       "--max-length 64 --learning-rate 3e-3 --warmup-ratio 0.1 --log-steps 1 --device cpu" \
       "--threads 1 --mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4" \
       "--draft-micro-batch-size 2 --save-interval 0 --num-depths 4"
}

for np in 1 2 4; do  # 4 ranks: micro-batches of 1 (the global batch of 4)
  run_np $np $(args "$W/np$np") --num-epochs 1 --max-steps 8 \
    $([ $np = 4 ] && echo --draft-micro-batch-size 1) >"$W/np$np.log" 2>&1 ||
    { tail -30 "$W/np$np.log"; fail "P-EAGLE training at $np rank(s)"; }
done
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2")" 1e-5 || fail "1 vs 2 ranks"
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np4")" 1e-5 || fail "1 vs 4 ranks"
run_np 2 $(args "$W/offload") --num-epochs 1 --max-steps 8 --cpu-offload >"$W/offload.log" 2>&1 ||
  { tail -30 "$W/offload.log"; fail "P-EAGLE training with --cpu-offload"; }
compare_exports "$(latest_ckpt "$W/np2")" "$(latest_ckpt "$W/offload")" 0 || fail "--cpu-offload"
for s in shard_grad_op no_shard; do
  run_np 2 $(args "$W/$s") --num-epochs 1 --max-steps 8 --sharding-strategy $s >"$W/$s.log" 2>&1 ||
    { tail -30 "$W/$s.log"; fail "P-EAGLE training, $s"; }
  compare_exports "$(latest_ckpt "$W/np2")" "$(latest_ckpt "$W/$s")" 1e-5 || fail "full_shard vs $s"
done
"$PY" - "$W/np1/metrics.jsonl" "$(latest_ckpt "$W/np1")" <<'PYEOF' || fail "P-EAGLE metrics or export"
import json, os, sys
from safetensors.torch import load_file
rows = [r for r in map(json.loads, open(sys.argv[1])) if "train/loss" in r]
first, last = rows[0], rows[-1]
assert len(rows) == 8, len(rows)
assert last["train/loss"] < first["train/loss"], (first["train/loss"], last["train/loss"])
for k in ("train/acc", "train/position_0_acc", "train/position_3_acc"):
    assert k in last, (k, sorted(last))
assert "train/position_4_acc" not in last, sorted(last)
cfg = json.load(open(os.path.join(sys.argv[2], "config.json")))
assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["mask_token_id"] == 511, cfg
w = load_file(os.path.join(sys.argv[2], "model.safetensors"))
for n in ("mask_hidden", "embed_tokens.weight", "fc.weight", "layers.0.hidden_norm.weight",
          "layers.1.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"):
    assert n in w, (n, sorted(w))
assert w["mask_hidden"].numel() == 3 * 64, w["mask_hidden"].shape
print(f"loss {first['train/loss']:.3f} -> {last['train/loss']:.3f}, acc {last['train/acc']:.3f}, "
      f"depth 3 acc {last['train/position_3_acc']:.3f}")
PYEOF
out=$("$BIN" check-export "$(latest_ckpt "$W/np1")" --for vllm --target-model-path "$DATA/target" 2>&1) ||
  { echo "$out"; fail "check-export on the P-EAGLE export"; }
grep -q " 0 ERROR" <<<"$out" || { echo "$out"; fail "check-export found errors"; }

# Evaluation from the export: every depth at every anchor, walked as the engine drafts.
run_np 1 --init-checkpoint "$(latest_ckpt "$W/np1")" --eval-only --target-model-path "$DATA/target" \
  --draft-model-config "$W/peagle.json" --eval-hidden-states-path "$DATA/eval_hidden_states" \
  --cache-dir "$DATA/cache" --max-length 64 --device cpu --threads 1 --mixed-precision fp32 \
  --draft-global-batch-size 2 --draft-micro-batch-size 2 --num-depths 4 \
  --output-dir "$W/eval" >"$W/eval.log" 2>&1 || { tail -30 "$W/eval.log"; fail "eval-only"; }
"$PY" - "$W/eval/metrics.jsonl" <<'PYEOF' || fail "P-EAGLE evaluation metrics"
import json, sys
ev = [r for r in map(json.loads, open(sys.argv[1])) if "eval/acc" in r][-1]
assert 1.0 <= ev["eval/accept_len"] <= 5.0, ev
print(f"eval accept_len {ev['eval/accept_len']:.3f}, acc {ev['eval/acc']:.3f}")
PYEOF

# SIGKILLed after step 5 (rank 1 kills itself: the test hook, no timing), one step past the
# checkpoint of step 4, and resumed to 8: bitwise the uninterrupted 2-rank run.
FSDP_TEST_KILL_AT_STEP=5 FSDP_TEST_KILL_RANK=1 run_np 2 $(args "$W/part") --num-epochs 1 \
  --max-steps 8 --save-steps 4 >"$W/part1.log" 2>&1 && { tail -20 "$W/part1.log"; fail "the run to be killed exited 0"; }
[ "$(latest_ckpt "$W/part")" = "$W/part/epoch_0_step_4" ] || fail "no checkpoint of step 4 alone: $(ls "$W/part")"
run_np 2 $(args "$W/part") --num-epochs 1 --max-steps 8 --save-steps 4 --resume auto >"$W/part2.log" 2>&1 ||
  { tail -30 "$W/part2.log"; fail "resumed half"; }
grep -q "resumed from .*step_4" "$W/part2.log" || fail "did not resume from step 4"
compare_exports "$(latest_ckpt "$W/np2")" "$(latest_ckpt "$W/part")" 0 || fail "resume is not bitwise exact"
# The step-4 state resumed on 2 ranks (resharded): the same weights within tolerance.
run_np 1 $(args "$W/other") --num-epochs 1 --max-steps 4 >"$W/other1.log" 2>&1 ||
  { tail -30 "$W/other1.log"; fail "first half (other rank count)"; }
run_np 2 $(args "$W/other") --num-epochs 1 --max-steps 8 --resume >"$W/other2.log" 2>&1 ||
  { tail -30 "$W/other2.log"; fail "resumed on 2 ranks"; }
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/other")" 1e-5 || fail "resume on 2 ranks"

# Options a P-EAGLE draft cannot honour are refused by name.
for bad in "--packing" "--sp-ulysses-size 2" "--ttt-length 5" "--lora-rank 4" "--num-anchors 8" \
           "--export-for sglang" "--down-sample-ratio-min 0.9"; do
  expect_usage_error "$bad" "$BIN" $(args "$W/bad") --max-steps 1 $bad
  grep -q -- "${bad%% *}" <<<"$out" || { echo "$out" | tail -5; fail "$bad: the error does not name it"; }
done
expect_usage_error "no mask token" "$BIN" $(args "$W/bad") --max-steps 1 \
  --draft-model-config "$W/nomask.json"
grep -q -- "mask" <<<"$out" || { echo "$out" | tail -5; fail "no mask token: not named"; }
echo PASS
