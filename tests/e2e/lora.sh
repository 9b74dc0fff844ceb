#!/usr/bin/env bash
# LoRA adaptation of an existing draft end to end (docs/model.md "LoRA"): a base draft is trained,
# then adapted with --lora-rank at 1 and 2 ranks (same weights); the base's frozen weights leave
# the run untouched; checkpoints export the merged draft, which evaluates equal to the adapted one
# (fp32, 1e-6), and optionally the adapters in PEFT's layout (consistent with the merge);
# `fsdp-train export` merges the training state the same way; a resume is bitwise exact; the
# training state holds no optimizer state for the base; bad combinations are refused by name.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/lora"; rm -rf "$W"; mkdir -p "$W"
FP32="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0"

"$BIN" $(train_args "$DATA" "$W/base") $FP32 --num-epochs 1 --max-steps 6 >"$W/base.log" 2>&1 ||
  { tail -20 "$W/base.log"; fail "base draft"; }
BASE="$(latest_ckpt "$W/base")"
LORA="--init-checkpoint $BASE --lora-rank 4 --lora-alpha 8 --learning-rate 5e-3 --eval-hidden-states-path $DATA/eval_hidden_states --eval-steps 3"

for np in 1 2; do
  run_np $np $(train_args "$DATA" "$W/np$np") $FP32 $LORA --num-epochs 1 --max-steps 6 \
    --export-lora-adapters >"$W/np$np.log" 2>&1 || { tail -20 "$W/np$np.log"; fail "LoRA at $np rank(s)"; }
done
grep -q "LoRA: rank 4, alpha 8" "$W/np2.log" || { grep LoRA "$W/np2.log"; fail "no LoRA summary line"; }
compare_exports "$(latest_ckpt "$W/np1")" "$(latest_ckpt "$W/np2")" 1e-5 || fail "LoRA: 1 vs 2 ranks"
CK="$(latest_ckpt "$W/np2")"

# The export is the merged draft: the base's names and config, the untargeted weights bitwise the
# base's, the targeted ones moved, and equal to base + scale * B A from the PEFT adapter files.
"$PY" - "$BASE" "$CK" <<'PYEOF' || fail "merged export and PEFT adapters"
import json, sys
import torch
from safetensors.torch import load_file
base, ck = sys.argv[1], sys.argv[2]
b, m = load_file(base + "/model.safetensors"), load_file(ck + "/model.safetensors")
assert b.keys() == m.keys(), sorted(set(b) ^ set(m))
assert json.load(open(base + "/config.json")) == json.load(open(ck + "/config.json"))
targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
moved = 0
for k in b:
    if any(f".{t}." in k for t in targets):
        moved += int(not torch.equal(b[k], m[k]))
    else:
        assert torch.equal(b[k], m[k]), f"{k} is frozen but changed"
assert moved == 7, moved
cfg = json.load(open(ck + "/adapter/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8, cfg
assert sorted(cfg["target_modules"]) == sorted(targets), cfg
ad = load_file(ck + "/adapter/adapter_model.safetensors")
assert len(ad) == 14, sorted(ad)
worst = 0.0
for t in targets:
    mod = ("midlayer.self_attn." if t.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "midlayer.mlp.") + t
    A = ad[f"base_model.model.{mod}.lora_A.weight"].double()
    B = ad[f"base_model.model.{mod}.lora_B.weight"].double()
    want = b[mod + ".weight"].double() + 2.0 * B @ A
    worst = max(worst, ((m[mod + ".weight"].double() - want).norm() / want.norm()).item())
assert worst < 1e-6, worst
assert json.load(open(ck + "/lora.json"))["rank"] == 4
print(f"merged export: untargeted weights bitwise the base's, 7 merged (vs PEFT files {worst:.1e})")
PYEOF

# The merged export evaluates as the adapted draft did at the same step.
"$BIN" --init-checkpoint "$CK" --eval-only --target-model-path "$DATA/target" \
  --draft-model-config "$CK/config.json" --eval-hidden-states-path "$DATA/eval_hidden_states" \
  --cache-dir "$DATA/cache" --max-length 64 --ttt-length 3 --mixed-precision fp32 --device cpu \
  --threads 1 --draft-global-batch-size 4 --draft-micro-batch-size 2 --output-dir "$W/eval" \
  >"$W/eval.log" 2>&1 || { tail -20 "$W/eval.log"; fail "eval-only of the merged export"; }
"$PY" - "$W/np2/metrics.jsonl" "$W/eval/metrics.jsonl" <<'PYEOF' || fail "merged export evaluates differently"
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"eval/ploss_0"' in l][-1]
a, b = last(sys.argv[1]), last(sys.argv[2])
keys = [k for k in a if k.startswith("eval/ploss_") or k.startswith("eval/acc_")]
assert keys, a
worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-12) for k in keys)
assert worst <= 1e-6, [(k, a[k], b[k]) for k in keys]
print(f"merged export evaluates as the adapted draft: {len(keys)} metrics, worst relative {worst:.1e}")
PYEOF

# `fsdp-train export` merges the training state the same way.
"$BIN" export --checkpoint "$CK" --output "$W/reexport" --dtype fp32 >"$W/reexport.log" 2>&1 ||
  { cat "$W/reexport.log"; fail "fsdp-train export of a LoRA checkpoint"; }
compare_exports "$W/reexport" "$CK" 1e-6 || fail "fsdp-train export differs from the run's own merged export"

# No masters or moments for the base: the LoRA state is far smaller than a full fine-tune's.
run_np 2 $(train_args "$DATA" "$W/full") $FP32 --init-checkpoint "$BASE" --num-epochs 1 --max-steps 6 \
  >"$W/full.log" 2>&1 || { tail -20 "$W/full.log"; fail "full fine-tune"; }
lora_bytes=$(du -sb "$CK/train_state" | cut -f1); full_bytes=$(du -sb "$(latest_ckpt "$W/full")/train_state" | cut -f1)
echo "training state: LoRA $lora_bytes bytes, full fine-tune $full_bytes bytes"
[ $((lora_bytes * 2)) -lt "$full_bytes" ] || fail "the LoRA training state is not smaller than half the full one"

# Exact resume: 3 steps + resume to 6 == 6 straight (2 ranks).
run_np 2 $(train_args "$DATA" "$W/part") $FP32 $LORA --num-epochs 1 --max-steps 3 --export-lora-adapters \
  >"$W/part1.log" 2>&1 || { tail -20 "$W/part1.log"; fail "first half"; }
run_np 2 $(train_args "$DATA" "$W/part") $FP32 $LORA --num-epochs 1 --max-steps 6 --export-lora-adapters \
  --resume >"$W/part2.log" 2>&1 || { tail -20 "$W/part2.log"; fail "resumed half"; }
compare_exports "$CK" "$(latest_ckpt "$W/part")" 0 || fail "LoRA resume is not bitwise exact"

# Refusals, each naming what to change.
expect_usage_error "LoRA without --init-checkpoint" "$BIN" $(train_args "$DATA" "$W/e1") --lora-rank 4 --max-steps 1
grep -q -- "--init-checkpoint" <<<"$out" || { echo "$out"; fail "the refusal does not name --init-checkpoint"; }
expect_usage_error "unknown LoRA target" "$BIN" $(train_args "$DATA" "$W/e2") $LORA --lora-targets q_proj,qkv --max-steps 1
grep -q "qkv" <<<"$out" || { echo "$out"; fail "the refusal does not name the target"; }
expect_usage_error "LoRA with another vocab mapping" "$BIN" $(train_args "$DATA" "$W/e3") $LORA \
  --vocab-mapping-path "$DATA/cache/none.pt" --max-steps 1
grep -q -- "--vocab-mapping-path" <<<"$out" || { echo "$out"; fail "the refusal does not name --vocab-mapping-path"; }
echo PASS
