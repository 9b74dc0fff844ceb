#!/usr/bin/env bash
# Every producer's feature format, written by Python from the same samples as the producers write
# them (SpecForge --compress: gzip of torch.save; speculators: hs_<i>.safetensors + a datasets
# Arrow directory for the loss mask, the last layer before the final norm; ModelOpt: one
# torch.save dict per conversation; DeepSpec: manifest.json + 56-byte samples.idx records + raw
# shards), trains with the same per-step losses as the .ckpt tree, directly and after `convert`;
# fp8 native shards train; `vocab-map` writes the mapping training computes, read back by
# torch.load(weights_only=True), reading only token bytes; the dump's own vocab_mapping.pt is
# used; a DeepSpec cache of other layers, and damaged files of each format, are clear errors.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data formats --num-samples 40 --min-len 12 --max-len 60 --samples-per-dir 10 --seed 5)
W="$BUILD/e2e_work/producer_formats"; rm -rf "$W"; mkdir -p "$W"

"$PY" - "$DATA" "$W" "$SRC" <<'PYEOF' || fail "writing the producers' formats"
import glob, json, os, sys
import torch
sys.path.insert(0, os.path.join(sys.argv[3], "tests", "e2e", "lib"))
from producer_writers import (Sample, final_norm, target_with_final_norm, write_deepspec,
                              write_modelopt, write_specforge_gz, write_speculators)

data, w = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(data, "hidden_states", "**", "*.ckpt"), recursive=True))
samples = [torch.load(f, weights_only=True) for f in files]
H = samples[0]["hidden_state"].shape[-1]
rel = [os.path.relpath(f, os.path.join(data, "hidden_states")) for f in files]
# EAGLE3 features: the three captured layers are aux_hidden_state, the last state hidden_state.
three = [Sample(s["input_ids"], s["loss_mask"], s["aux_hidden_state"][0], s["hidden_state"][0])
         for s in samples]

write_specforge_gz(files, rel, os.path.join(w, "gz"))
write_modelopt(os.path.join(w, "modelopt"), three)
write_deepspec(os.path.join(w, "deepspec"), three, [1, 5, 8], indent=2, sort_keys=True)
write_deepspec(os.path.join(w, "deepspec_other"), three, [1, 5, 9], indent=2, sort_keys=True)
# Five captured layers, as DeepSpec's EAGLE3 recipes capture: the three layers plus two more
# (the last layer and the first again: any values do for training).
five = [s._replace(aux=torch.cat([s.aux, s.last, s.aux[..., :H]], dim=-1)) for s in three]
write_deepspec(os.path.join(w, "deepspec5"), five, [1, 3, 5, 7, 9], indent=2, sort_keys=True)

# speculators: the stored last layer is BEFORE the target's final norm. Take each sample's
# hidden_state as that pre-norm state; the reference .ckpt tree (spec_ref) holds
# norm(hidden_state) as the target's final norm (which the toy target gets here) gives it.
tgt = os.path.join(w, "target")
norm_w, eps = target_with_final_norm(os.path.join(data, "target"), tgt, H)
cfg = json.load(open(os.path.join(tgt, "config.json")))
cfg["num_hidden_layers"] = 12  # so that the draft's layer ids below are in range
json.dump(cfg, open(os.path.join(tgt, "config.json"), "w"))
draft = json.load(open(os.path.join(data, "draft_config.json")))
draft["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 5, 8]}
json.dump(draft, open(os.path.join(w, "draft_config.json"), "w"), indent=1)
draft5 = dict(draft, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 7, 9]})
json.dump(draft5, open(os.path.join(w, "draft_config5.json"), "w"), indent=1)

write_speculators(os.path.join(w, "speculators", "preprocessed"), three,
                  texts=[f"conversation {i}" for i in range(len(samples))])
for r, s in zip(rel, samples):
    out = os.path.join(w, "spec_ref", r)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    torch.save(dict(s, hidden_state=final_norm(s["hidden_state"], norm_w, eps)), out)
print(f"wrote {len(samples)} samples in 5 formats (H={H})")
PYEOF

# Per-step losses and accuracies of a short fp32 run (1 rank; ranks are tested elsewhere).
train_on() {  # NAME FEATURES [FLAGS...]
  local name="$1" feat="$2"; shift 2
  "$BIN" --target-model-path "$W/target" --draft-model-config "$W/draft_config.json" \
    --train-hidden-states-path "$feat" --cache-dir "$W/cache" --output-dir "$W/run_$name" \
    --max-length 64 --ttt-length 3 --learning-rate 1e-3 --warmup-ratio 0.1 --log-steps 1 \
    --device cpu --threads 1 --mixed-precision fp32 --draft-global-batch-size 4 \
    --draft-micro-batch-size 2 --num-epochs 1 --max-steps 5 --save-interval 0 --seed 11 "$@" \
    >"$W/run_$name.log" 2>&1 || { tail -20 "$W/run_$name.log"; fail "training on $name"; }
}
same_losses() {  # A B: identical per-step losses and accuracies
  "$PY" - "$W/run_$1/metrics.jsonl" "$W/run_$2/metrics.jsonl" "$1" "$2" <<'PYEOF'
import json, sys
def steps(p):
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("train/") and
                        ("loss" in k or "/acc_" in k)} for r in map(json.loads, open(p)) if "train/loss" in r}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a and a.keys() == b.keys(), (sorted(a), sorted(b))
for s in a:
    assert a[s] == b[s], (sys.argv[3], sys.argv[4], s, a[s], b[s])
print(f"{sys.argv[3]} == {sys.argv[4]}: {len(a)} steps, losses and accuracies identical")
PYEOF
}

train_on ckpt "$DATA/hidden_states"
train_on gz "$W/gz"
same_losses ckpt gz || fail ".ckpt.gz trains differently from .ckpt"
train_on modelopt "$W/modelopt"
same_losses ckpt modelopt || fail "ModelOpt dump trains differently"
train_on deepspec "$W/deepspec"
same_losses ckpt deepspec || fail "DeepSpec cache trains differently"
train_on spec_ref "$W/spec_ref"
train_on speculators "$W/speculators/preprocessed/hidden_states"
grep -q "before the target's final norm" "$W/run_speculators.log" || fail "no final-norm line for speculators features"
same_losses spec_ref speculators || fail "speculators dump trains differently from the normed .ckpt"

# convert from each format gives the same training; the speculators flag travels in the index.
for f in gz modelopt deepspec speculators/preprocessed/hidden_states; do
  n="${f%%/*}"
  "$BIN" convert --input "$W/$f" --output "$W/native_$n" --shard-size 64K >"$W/convert_$n.log" 2>&1 ||
    { tail -5 "$W/convert_$n.log"; fail "convert of $n"; }
  train_on "native_$n" "$W/native_$n"
done
same_losses ckpt native_gz && same_losses ckpt native_modelopt && same_losses ckpt native_deepspec &&
  same_losses spec_ref native_speculators || fail "converted features train differently"

# fp8 native shards: about half the bytes; they train (the quality cost is measured in
# benchmarks/data/fp8_quality.sh, not here).
"$BIN" convert --input "$DATA/hidden_states" --output "$W/native_fp8" --dtype fp8_e4m3 >/dev/null 2>&1 || fail "convert --dtype fp8_e4m3"
"$BIN" convert --input "$DATA/hidden_states" --output "$W/native_bf16" >/dev/null 2>&1 || fail "convert bf16"
b16=$(du -b --apparent-size -s "$W/native_bf16" | cut -f1); b8=$(du -b --apparent-size -s "$W/native_fp8" | cut -f1)
echo "native bf16 $b16 bytes, fp8 $b8 bytes"
[ $((b8 * 100)) -lt $((b16 * 65)) ] || fail "fp8 shards are not much smaller ($b8 vs $b16)"
train_on fp8 "$W/native_fp8"

# A DeepSpec cache of other layers than the draft reads: refused at start-up, naming both.
expect_usage_error "deepspec layers" "$BIN" --target-model-path "$W/target" --draft-model-config "$W/draft_config.json" \
  --train-hidden-states-path "$W/deepspec_other" --output-dir "$W/x" --device cpu --max-steps 1
grep -q "layer outputs \[1, 5, 9\]" <<<"$out" || { echo "$out" | tail -3; fail "layer mismatch not named"; }

# A five-layer DeepSpec cache trains a draft whose fc reads five layers (fc input 5H); 1 and 2
# ranks agree (micro-batch 1: samples of different lengths are normalised per micro-batch, so
# only then are the micro-batches the same at both rank counts); the export is for vLLM (SGLang builds fc for three) and passes check-export.
# Without --export-for vllm, start-up refuses; the three-layer draft refuses the five-layer cache.
for np in 1 2; do
  run_np $np --target-model-path "$W/target" --draft-model-config "$W/draft_config5.json" \
    --train-hidden-states-path "$W/deepspec5" --cache-dir "$W/cache" --output-dir "$W/five_np$np" \
    --max-length 64 --ttt-length 3 --learning-rate 1e-3 --log-steps 1 --device cpu --threads 1 \
    --mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 1 \
    --num-epochs 1 --max-steps 4 --save-interval 0 --export-for vllm >"$W/five_np$np.log" 2>&1 ||
    { tail -20 "$W/five_np$np.log"; fail "five-layer training at $np rank(s)"; }
done
compare_exports "$(latest_ckpt "$W/five_np1")" "$(latest_ckpt "$W/five_np2")" 1e-5 || fail "five layers: 1 vs 2 ranks"
"$PY" - "$(latest_ckpt "$W/five_np1")" <<'PYEOF' || fail "five-layer export"
import json, sys
from safetensors import safe_open
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
assert cfg["num_aux_hidden_states"] == 5, cfg
with safe_open(d + "/model.safetensors", "pt") as f:
    assert list(f.get_slice("fc.weight").get_shape()) == [64, 320], f.get_slice("fc.weight").get_shape()
print("five-layer export: fc.weight [64, 320], num_aux_hidden_states 5")
PYEOF
"$BIN" check-export "$(latest_ckpt "$W/five_np1")" --for vllm --target-model-path "$W/target" >"$W/five_check.log" 2>&1 ||
  { cat "$W/five_check.log"; fail "check-export of the five-layer draft"; }
expect_usage_error "five layers for sglang" "$BIN" --target-model-path "$W/target" --draft-model-config "$W/draft_config5.json" \
  --train-hidden-states-path "$W/deepspec5" --output-dir "$W/z" --device cpu --max-steps 1
grep -q -- "--export-for vllm" <<<"$out" || { echo "$out" | tail -3; fail "no --export-for hint"; }
expect_usage_error "five-layer cache, three-layer draft" "$BIN" --target-model-path "$W/target" \
  --draft-model-config "$W/draft_config.json" --train-hidden-states-path "$W/deepspec5" --output-dir "$W/z" --device cpu --max-steps 1
grep -q "holds 5 captured layers" <<<"$out" || { echo "$out" | tail -3; fail "layer count not named"; }

# vocab-map: the mapping training builds, from tokens only, read by torch.load(weights_only=True).
"$BIN" vocab-map --features "$W/deepspec" --draft-vocab-size 256 --target-model-path "$W/target" \
  --max-length 64 --out "$W/map.pt" >"$W/vocab_map.log" 2>&1 || { cat "$W/vocab_map.log"; fail "vocab-map"; }
cat "$W/vocab_map.log"
"$PY" - "$W/map.pt" "$W/cache/vocab_mapping" "$W/vocab_map.log" <<'PYEOF' || fail "vocab-map output"
import glob, re, sys, torch
m = torch.load(sys.argv[1], weights_only=True)
assert m["d2t"].dtype == torch.int64 and m["d2t"].shape == (256,), m["d2t"].shape
assert m["t2d"].dtype == torch.bool and m["t2d"].shape == (512,), m["t2d"].shape
cached = [torch.load(p, weights_only=True) for p in glob.glob(sys.argv[2] + "/*.pt")]
assert any(torch.equal(c["d2t"], m["d2t"]) and torch.equal(c["t2d"], m["t2d"]) for c in cached), "differs from training's mapping"
log = open(sys.argv[3]).read()
read, total = map(int, re.search(r"read (\d+) of (\d+) bytes", log).groups())
assert read * 20 < total, (read, total)  # tokens only: 6 of ~1000 bytes a token here
print(f"vocab-map equals training's mapping; read {read} of {total} bytes")
PYEOF
# The dump's own vocab_mapping/vocab_mapping.pt (SpecForge's place) is taken when it fits.
mkdir -p "$W/gz/vocab_mapping" && cp "$W/map.pt" "$W/gz/vocab_mapping/vocab_mapping.pt"
train_on gz_map "$W/gz" --cache-dir "$W/cache_empty"
grep -q "the dump's own mapping" "$W/run_gz_map.log" || fail "the dump's vocab_mapping.pt was not used"
same_losses ckpt gz_map || fail "the dump's mapping trains differently"

# Damaged files of each new format: exit 2 naming the file; --skip-bad-samples skips them.
cp -r "$W/gz" "$W/gz_bad"
gzs=("$W"/gz_bad/rows_*/*.gz); f="${gzs[0]}"
dd if="$f" of="$f.part" bs=300 count=1 status=none && mv "$f.part" "$f"
expect_usage_error "truncated gzip" "$BIN" --target-model-path "$W/target" --draft-model-config "$W/draft_config.json" \
  --train-hidden-states-path "$W/gz_bad" --output-dir "$W/y" --device cpu --max-steps 1
grep -q "truncated gzip" <<<"$out" && grep -q "$(basename "$f")" <<<"$out" || { echo "$out" | tail -3; fail "truncated gzip not named"; }
train_on gz_skip "$W/gz_bad" --skip-bad-samples
grep -q "skipped" "$W/run_gz_skip.log" || fail "skip mode did not report the bad .ckpt.gz"
cp -r "$W/deepspec" "$W/ds_bad" && truncate -s 500000 "$W/ds_bad/shard-00000.bin"
train_on ds_skip "$W/ds_bad" --skip-bad-samples
grep -q "runs past the end of the shard" "$W/run_ds_skip.log" || fail "truncated DeepSpec shard not reported"
echo "PASS producer_formats"
