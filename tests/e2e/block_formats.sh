#!/usr/bin/env bash
# DFlash and DSpark drafts train from every producer whose layout carries their features, not only
# SpecForge's .ckpt files: from DSpark toy features (benchmarks/data/dflash_features.py --dspark)
# Python writes SpecForge --compress (.ckpt.gz), speculators (hs_<i>.safetensors, the target layers
# then the last layer BEFORE the final norm, loss mask in an Arrow dataset), ModelOpt ({id}.pt) and
# DeepSpec (manifest.json with target_layer_ids + samples.idx + a raw shard) as each producer
# writes them, and both drafts give the same per-step train/loss (and DSpark's metrics) as the
# .ckpt tree, directly and after `convert` to native bf16 shards; fp8 native shards train (finite,
# falling loss). convert tells block-draft .ckpt keys from EAGLE3's; a DFlash .ckpt without
# target_last_hidden_states converts (with --target-model-path) and trains the same. Refused by
# name: a DeepSpec cache of other layers (target_layer_ids), a wrong number of captured layers,
# a DSpark sample without target_last_hidden_states (.ckpt and native: the file and the key),
# --vocab-mapping-path with a real mapping (block drafts use the target's whole vocabulary).
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
TOY=$(toy_data block_formats --num-samples 24 --min-len 12 --max-len 40 --samples-per-dir 8 --seed 7)
W="$BUILD/e2e_work/block_formats"; rm -rf "$W"; mkdir -p "$W"

# DSpark features (hidden_states = target layers 1, 3, 5; target_last_hidden_states) and a DSpark
# config; DFlash features of the same samples (no target_last_hidden_states) and a DFlash config.
"$PY" "$SRC/benchmarks/data/dflash_features.py" "$TOY" "$W/dspark" --layers 1 --block-size 4 \
  --dspark >/dev/null || fail "making the DSpark features"
"$PY" "$SRC/benchmarks/data/dflash_features.py" "$TOY" "$W/dflash" --layers 1 --block-size 4 \
  >/dev/null || fail "making the DFlash features"

"$PY" - "$W" "$SRC" <<'PYEOF' || fail "writing the producers' formats"
import glob, os, sys
import torch
sys.path.insert(0, os.path.join(sys.argv[2], "tests", "e2e", "lib"))
from producer_writers import (Sample, final_norm, target_with_final_norm, write_deepspec,
                              write_modelopt, write_specforge_gz, write_speculators)

w = sys.argv[1]
src = os.path.join(w, "dspark", "hidden_states")
files = sorted(glob.glob(os.path.join(src, "**", "*.ckpt"), recursive=True))
rel = [os.path.relpath(f, src) for f in files]
samples = [torch.load(f, weights_only=True) for f in files]
H = samples[0]["target_last_hidden_states"].shape[-1]
L = samples[0]["hidden_states"].shape[-1] // H
assert L == 3, L
# DSpark features: the target layers are hidden_states, the last state target_last_hidden_states
# (the same tensors serve DFlash, which does not read the last state).
block = [Sample(s["input_ids"], s["loss_mask"], s["hidden_states"], s["target_last_hidden_states"])
         for s in samples]

def save(tree, r, d):
    out = os.path.join(w, tree, r)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    torch.save(d, out)

write_specforge_gz(files, rel, os.path.join(w, "gz"))
write_modelopt(os.path.join(w, "modelopt"), block)
write_deepspec(os.path.join(w, "deepspec"), block, [1, 3, 5])
write_deepspec(os.path.join(w, "deepspec_other"), block, [1, 3, 6])

# speculators: each sample's target_last_hidden_states is taken as the pre-norm last state; the
# reference .ckpt tree (spec_ref) holds norm(state) as the target's final norm (which the toy
# target gets here) gives it.
norm_w, eps = target_with_final_norm(os.path.join(w, "dspark", "target"), os.path.join(w, "target"), H)
write_speculators(os.path.join(w, "speculators", "preprocessed"), block)
for r, s in zip(rel, samples):
    S = s["input_ids"].numel()
    last = s["target_last_hidden_states"].reshape(S, H)
    save("spec_ref", r, dict(s, target_last_hidden_states=final_norm(last, norm_w, eps)))

# One sample (the second) without target_last_hidden_states: DSpark must name it; a .ckpt with
# both EAGLE3's and the block keys: convert cannot tell which.
for i, s in enumerate(samples):
    d = dict(s)
    if i == 1:
        del d["target_last_hidden_states"]
    save("missing", rel[i], d)
save("both", "data_0.ckpt", dict(samples[0], hidden_state=samples[0]["target_last_hidden_states"],
                                 aux_hidden_state=samples[0]["hidden_states"]))
print(f"{len(samples)} samples (S up to {max(s['input_ids'].numel() for s in samples)}, H={H}): "
      f"gz, ModelOpt, DeepSpec, speculators, and the reference trees")
print("MISSING", os.path.join(w, "missing", rel[1]))
PYEOF
MISSING=$(find "$W/missing" -name '*.ckpt' | LC_ALL=C sort | sed -n 2p)

# Per-step metrics of a short fp32 run (1 rank; ranks are tested in dflash_train/dspark_train).
train_on() {  # ALGO NAME FEATURES [FLAGS...]
  local algo="$1" name="$2" feat="$3"; shift 3
  "$BIN" --target-model-path "$W/target" --draft-model-config "$W/$algo/draft_config.json" \
    --train-hidden-states-path "$feat" --output-dir "$W/run_${algo}_$name" --max-length 64 \
    --learning-rate 3e-3 --warmup-ratio 0.1 --log-steps 1 --device cpu --threads 1 \
    --mixed-precision fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 \
    --num-anchors 8 --num-epochs 1 --max-steps 4 --save-interval 0 --seed 3 "$@" \
    >"$W/run_${algo}_$name.log" 2>&1 || { tail -20 "$W/run_${algo}_$name.log"; fail "$algo on $name"; }
}
same_losses() {  # ALGO A B: identical per-step train/ metrics (loss, accuracies, DSpark's terms)
  "$PY" - "$W/run_$1_$2/metrics.jsonl" "$W/run_$1_$3/metrics.jsonl" "$1: $2" "$3" <<'PYEOF'
import json, sys
def steps(p):
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("train/")}
            for r in map(json.loads, open(p)) if "train/loss" in r}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a and a.keys() == b.keys(), (sorted(a), sorted(b))
for s in a:
    assert a[s] == b[s], (sys.argv[3], sys.argv[4], s,
                          {k: (a[s].get(k), b[s].get(k)) for k in a[s].keys() | b[s].keys()
                           if a[s].get(k) != b[s].get(k)})
print(f"{sys.argv[3]} == {sys.argv[4]}: {len(a)} steps, {len(a[min(a)])} train/ metrics identical")
PYEOF
}
convert() {  # INPUT OUT [FLAGS...]
  local in="$1" out="$2"; shift 2
  "$BIN" convert --input "$in" --output "$out" --shard-size 64K "$@" >"$out.log" 2>&1 ||
    { tail -5 "$out.log"; fail "convert of $in"; }
}

# DSpark on each producer's layout, and on native shards converted from them.
train_on dspark ckpt "$W/dspark/hidden_states"
for f in gz modelopt deepspec; do
  train_on dspark $f "$W/$f"
  same_losses dspark ckpt $f || fail "DSpark trains differently on $f"
done
train_on dspark spec_ref "$W/spec_ref"
train_on dspark speculators "$W/speculators/preprocessed/hidden_states"
grep -q "before the target's final norm" "$W/run_dspark_speculators.log" || fail "no final-norm line for speculators features"
same_losses dspark spec_ref speculators || fail "DSpark trains differently on speculators"
convert "$W/dspark/hidden_states" "$W/native_ckpt"
grep -q "ckpt (block keys) input" "$W/native_ckpt.log" || fail "convert did not take the block keys"
convert "$W/speculators/preprocessed/hidden_states" "$W/native_speculators"
convert "$W/deepspec" "$W/native_deepspec"
train_on dspark native_ckpt "$W/native_ckpt"
train_on dspark native_deepspec "$W/native_deepspec"
train_on dspark native_speculators "$W/native_speculators"
same_losses dspark ckpt native_ckpt && same_losses dspark ckpt native_deepspec &&
  same_losses dspark spec_ref native_speculators || fail "DSpark trains differently on converted shards"

# DFlash: its own .ckpt files (no target_last_hidden_states), the DSpark files (the last state is
# not read), each producer's layout, and native shards.
train_on dflash ckpt "$W/dflash/hidden_states"
for f in dspark/hidden_states modelopt deepspec speculators/preprocessed/hidden_states native_ckpt; do
  n="${f%%/*}"
  train_on dflash "$n" "$W/$f"
  same_losses dflash ckpt "$n" || fail "DFlash trains differently on $n"
done
expect_usage_error "DFlash .ckpt without the last state, no hidden size" "$BIN" convert \
  --input "$W/dflash/hidden_states" --output "$W/native_dflash_x"
grep -q -- "--target-model-path" <<<"$out" || { echo "$out" | tail -3; fail "no --target-model-path hint"; }
convert "$W/dflash/hidden_states" "$W/native_dflash" --target-model-path "$W/target"
train_on dflash native_dflash "$W/native_dflash"
same_losses dflash ckpt native_dflash || fail "DFlash trains differently on its converted .ckpt files"

# fp8 native shards (per-token, per-layer scales): both drafts train, loss finite and falling.
convert "$W/dspark/hidden_states" "$W/native_fp8" --dtype fp8_e4m3
convert "$W/dflash/hidden_states" "$W/native_dflash_fp8" --dtype fp8_e4m3 --target-model-path "$W/target"
train_on dspark fp8 "$W/native_fp8" --max-steps 8 --num-epochs 2
train_on dflash fp8 "$W/native_dflash_fp8" --max-steps 8 --num-epochs 2
for a in dspark dflash; do
  "$PY" - "$W/run_${a}_fp8/metrics.jsonl" "$a" <<'PYEOF' || fail "$a on fp8 shards"
import json, math, sys
loss = [r["train/loss"] for r in map(json.loads, open(sys.argv[1])) if "train/loss" in r]
assert len(loss) == 8 and all(math.isfinite(x) for x in loss), loss
assert sum(loss[-2:]) < sum(loss[:2]), loss
print(f"{sys.argv[2]} on fp8 shards: loss {loss[0]:.3f} -> {loss[-1]:.3f}")
PYEOF
done

# A sample without target_last_hidden_states: DSpark stops naming the file and the key, in the
# .ckpt tree and in native shards converted from it (convert keeps what each file holds); DFlash
# trains on both as on its own files.
run_bad() {  # LABEL FEATURES: exit 2 naming the missing sample and target_last_hidden_states
  expect_usage_error "$1" "$BIN" --target-model-path "$W/target" --draft-model-config "$W/dspark/draft_config.json" \
    --train-hidden-states-path "$2" --output-dir "$W/bad_$(basename "$2")" --max-length 64 --device cpu --threads 1 \
    --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-anchors 8 --max-steps 4 --save-interval 0
  grep -q "target_last_hidden_states" <<<"$out" && grep -q "$(basename "$(dirname "$MISSING")")/$(basename "$MISSING")" <<<"$out" ||
    { echo "$out" | tail -4; fail "$1: the file or the key is not named"; }
  grep -E "error:.*target_last_hidden_states" <<<"$out"
}
run_bad "DSpark, .ckpt without target_last_hidden_states" "$W/missing"
convert "$W/missing" "$W/native_missing"
run_bad "DSpark, native sample without target_last_hidden_states" "$W/native_missing"
train_on dflash missing "$W/missing"
train_on dflash native_missing "$W/native_missing"
same_losses dflash ckpt missing && same_losses dflash ckpt native_missing || fail "DFlash on the mixed files"

# A .ckpt holding both key sets: convert asks which.
expect_usage_error "both key sets" "$BIN" convert --input "$W/both" --output "$W/native_both"
grep -q -- "--ckpt-keys" <<<"$out" || { echo "$out" | tail -3; fail "no --ckpt-keys hint"; }
convert "$W/both" "$W/native_both" --ckpt-keys block

# Refused at start-up: a DeepSpec cache (or its native shards) of other layers than
# dflash_config.target_layer_ids; a draft reading another number of layers (file and counts
# named); --vocab-mapping-path.
common=(--target-model-path "$W/target" --output-dir "$W/bad" --device cpu --max-steps 1)
expect_usage_error "DeepSpec layers" "$BIN" "${common[@]}" --draft-model-config "$W/dspark/draft_config.json" \
  --train-hidden-states-path "$W/deepspec_other"
grep -q "target_layer_ids" <<<"$out" && grep -q "\[1, 3, 6\]" <<<"$out" && grep -q "\[1, 3, 5\]" <<<"$out" ||
  { echo "$out" | tail -3; fail "DeepSpec layer mismatch not named"; }
convert "$W/deepspec_other" "$W/native_other"
expect_usage_error "native shards of other layers" "$BIN" "${common[@]}" --draft-model-config "$W/dflash/draft_config.json" \
  --train-hidden-states-path "$W/native_other"
grep -q "\[1, 3, 6\]" <<<"$out" || { echo "$out" | tail -3; fail "native layer mismatch not named"; }
"$PY" - "$W/dflash/draft_config.json" "$W/two_layers.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["dflash_config"]["target_layer_ids"] = [1, 5]
json.dump(c, open(sys.argv[2], "w"))
PYEOF
for f in dflash/hidden_states modelopt speculators/preprocessed/hidden_states; do
  expect_usage_error "two-layer draft on $f" "$BIN" "${common[@]}" --draft-model-config "$W/two_layers.json" \
    --train-hidden-states-path "$W/$f"
  grep -Eq "3 captured layers|3 auxiliary" <<<"$out" && grep -q "dflash_config.target_layer_ids" <<<"$out" &&
    grep -Eq "reads 2|2 auxiliary" <<<"$out" && grep -Eq "\.ckpt|\.pt|\.safetensors" <<<"$out" ||
    { echo "$out" | tail -3; fail "layer count on $f not named"; }
done
"$BIN" vocab-map --features "$W/dflash/hidden_states" --draft-vocab-size 256 --target-model-path "$W/target" \
  --out "$W/map.pt" >"$W/vocab_map.log" 2>&1 || { cat "$W/vocab_map.log"; fail "vocab-map"; }
for a in dflash dspark; do
  expect_usage_error "--vocab-mapping-path, $a" "$BIN" "${common[@]}" --draft-model-config "$W/$a/draft_config.json" \
    --train-hidden-states-path "$W/dspark/hidden_states" --vocab-mapping-path "$W/map.pt"
  grep -q -- "--vocab-mapping-path .* is an EAGLE3 option" <<<"$out" || { echo "$out" | tail -3; fail "--vocab-mapping-path not refused by name"; }
done
echo "PASS block_formats"
