#!/usr/bin/env bash
# Draft variants end to end (docs/model.md "Draft variants"): an EAGLE3.1 draft (fc_norm,
# norm_output) and a two-layer draft train on toy data; 1 rank and 2 ranks reach the same fp32
# weights; a resumed two-layer run ends bitwise equal to an uninterrupted one; the exports carry
# the variant's tensors under vLLM's names and its keys in config.json and pass check-export for
# vLLM, while SGLang is refused; a variant without --export-for vllm is refused at start-up.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/draft_variants"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --export-for vllm"

variant() {  # variant NAME JSON-UPDATE: the toy draft config with keys added
  "$PY" - "$DATA/draft_config.json" "$W/$1.json" "$2" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(json.loads(sys.argv[3]))
json.dump(c, open(sys.argv[2], "w"), indent=1)
PYEOF
}
variant eagle31 '{"fc_norm": true, "norm_output": true}'
variant layers2 '{"num_hidden_layers": 2}'

for v in eagle31 layers2; do
  for np in 1 2; do
    run_np $np $(train_args "$DATA" "$W/$v-np$np") --draft-model-config "$W/$v.json" $COMMON \
      --num-epochs 1 --max-steps 6 >"$W/$v-np$np.log" 2>&1 ||
      { tail -20 "$W/$v-np$np.log"; fail "$v: training at $np rank(s)"; }
  done
  compare_exports "$(latest_ckpt "$W/$v-np1")" "$(latest_ckpt "$W/$v-np2")" 1e-5 || fail "$v: 1 vs 2 ranks"
  CK="$(latest_ckpt "$W/$v-np2")"
  out=$("$BIN" check-export "$CK" --for vllm 2>&1); rc=$?
  [ $rc -eq 0 ] || { echo "$out"; fail "$v: check-export --for vllm: exit $rc"; }
  out=$("$BIN" check-export "$CK" --for sglang 2>&1); rc=$?
  [ $rc -ne 0 ] || { echo "$out"; fail "$v: check-export --for sglang accepted a variant SGLang does not build"; }
  grep -q "SGLang does not build" <<<"$out" || { echo "$out"; fail "$v: no reason given for SGLang"; }
done

# What the exports hold: the variant's tensors under vLLM's names, trained (not left at their
# initial ones), and the keys vLLM reads.
"$PY" - "$(latest_ckpt "$W/eagle31-np2")" "$(latest_ckpt "$W/layers2-np2")" <<'PYEOF' || fail "export contents"
import json, sys
from safetensors.torch import load_file
a, b = sys.argv[1], sys.argv[2]
ta, ca = load_file(a + "/model.safetensors"), json.load(open(a + "/config.json"))
assert ca["fc_norm"] is True and ca["norm_output"] is True, ca
for j in range(3):
    w = ta[f"fc_norm.{j}.weight"]
    assert w.shape == (64,), w.shape
    assert (w - 1).abs().max() > 1e-4, f"fc_norm.{j} was not trained"
assert "midlayer.self_attn.q_proj.weight" in ta and not any(k.startswith("layers.") for k in ta)
tb, cb = load_file(b + "/model.safetensors"), json.load(open(b + "/config.json"))
assert cb["num_hidden_layers"] == 2, cb
assert tb["layers.0.self_attn.q_proj.weight"].shape[1] == 128  # [embedding, hidden]
assert tb["layers.1.self_attn.q_proj.weight"].shape[1] == 64
assert "layers.1.hidden_norm.weight" not in tb and not any(k.startswith("midlayer.") for k in tb)
print("exports: EAGLE3.1 fc_norm.0-2 trained, keys written; two layers as layers.0/layers.1")
PYEOF

# Exact resume of the two-layer draft: 3 steps + resume to 6 == 6 straight (2 ranks).
run_np 2 $(train_args "$DATA" "$W/part") --draft-model-config "$W/layers2.json" $COMMON \
  --num-epochs 1 --max-steps 3 >"$W/part1.log" 2>&1 || { tail -20 "$W/part1.log"; fail "first half"; }
run_np 2 $(train_args "$DATA" "$W/part") --draft-model-config "$W/layers2.json" $COMMON \
  --num-epochs 1 --max-steps 6 --resume >"$W/part2.log" 2>&1 || { tail -20 "$W/part2.log"; fail "resumed half"; }
compare_exports "$(latest_ckpt "$W/layers2-np2")" "$(latest_ckpt "$W/part")" 0 || fail "two-layer resume is not bitwise exact"
# Resuming with another layer count is refused by name.
expect_usage_error "resume with another num_hidden_layers" \
  "$BIN" $(train_args "$DATA" "$W/part") --draft-model-config "$DATA/draft_config.json" $COMMON \
  --num-epochs 1 --max-steps 8 --resume
grep -q "num_hidden_layers" <<<"$out" || { echo "$out"; fail "the refusal does not name num_hidden_layers"; }

# A variant exported for the default engines (SGLang included) is refused before training.
expect_usage_error "EAGLE3.1 without --export-for vllm" \
  "$BIN" $(train_args "$DATA" "$W/refused") --draft-model-config "$W/eagle31.json" --max-steps 1
grep -q -- "--export-for vllm" <<<"$out" || { echo "$out"; fail "the refusal does not say --export-for vllm"; }
echo PASS
