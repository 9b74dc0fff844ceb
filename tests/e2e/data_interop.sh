#!/usr/bin/env bash
# gen-toy-data and convert end to end, checked from Python: torch.load sees the keys of docs/reference.md §1.3,
# dtypes and shapes in the generated .ckpt files, and the safetensors library loads the target
# shards and the native shards written by a 2-rank convert. Usage: data_interop.sh BUILD SOURCE
set -euo pipefail
BUILD="$1"
PY="${FSDP_PYTHON:-python3}"
MPIEXEC="${FSDP_MPIEXEC:-mpiexec}"
BIN="$BUILD/fsdp-train"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$BIN" gen-toy-data --out "$TMP/toy" --num-samples 24 --min-len 16 --max-len 40 \
  --hidden-size 32 --vocab-size 128 --draft-vocab-size 64 --samples-per-dir 10 --seed 1
test -f "$TMP/toy/hidden_states/rows_20-30/data_23.ckpt"

# --lengths: the given lengths, cycled over the samples.
"$BIN" gen-toy-data --out "$TMP/lens" --num-samples 5 --lengths 2,9,4 --samples-per-dir 5 >/dev/null
"$PY" - "$TMP/lens/hidden_states" <<'PYEOF'
import glob, sys, torch
files = sorted(glob.glob(sys.argv[1] + "/*/*.ckpt"), key=lambda f: int(f.rsplit("_", 1)[1][:-5]))
lengths = [torch.load(f, weights_only=True)["input_ids"].numel() for f in files]
assert lengths == [2, 9, 4, 2, 9], lengths
PYEOF

# Bad flags exit with code 2, name the flag and say what to do (a ---> HINT line).
set +e
out="$("$BIN" gen-toy-data --out "$TMP/y" --lengths 5,1 2>&1)"
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--lengths" <<<"$out" || { echo "--lengths 5,1 not refused: $out"; exit 1; }
set +e
out="$("$BIN" gen-toy-data --out "$TMP/x" --min-len 50 --max-len 10 2>&1)"
rc=$?
set -e
[ "$rc" = 2 ] || { echo "expected exit code 2, got $rc: $out"; exit 1; }
grep -q -- "--min-len" <<<"$out" || { echo "message does not name the flag: $out"; exit 1; }
[ "$(grep -c -- "---> HINT:" <<<"$out")" -ge 1 ] || { echo "no ---> HINT line: $out"; exit 1; }

OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$MPIEXEC" --oversubscribe --bind-to none -n 2 \
  "$BIN" convert --input "$TMP/toy/hidden_states" --output "$TMP/native" --shard-size 40K
test -f "$TMP/native/features.index.json"

"$PY" - "$TMP" <<'PYEOF'
import glob, json, os, sys
import torch
from safetensors import safe_open
from safetensors.torch import load_file

tmp = sys.argv[1]
files = sorted(glob.glob(os.path.join(tmp, "toy/hidden_states/**/*.ckpt"), recursive=True))
assert len(files) == 24, len(files)
cfg = json.load(open(os.path.join(tmp, "toy/draft_config.json")))
H, V = cfg["hidden_size"], cfg["vocab_size"]
assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64
for f in files:
    d = torch.load(f, weights_only=True)
    assert set(d) == {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}, d.keys()
    S = d["input_ids"].shape[0]
    assert d["input_ids"].dtype == torch.int64 and d["input_ids"].shape == (S,)
    assert d["loss_mask"].dtype == torch.int64 and d["loss_mask"].shape == (S,)
    assert d["hidden_state"].dtype == torch.bfloat16 and d["hidden_state"].shape == (1, S, H)
    assert d["aux_hidden_state"].dtype == torch.bfloat16 and d["aux_hidden_state"].shape == (1, S, 3 * H)
    assert 16 <= S <= 40 and int(d["input_ids"].max()) < V

# Target shards through the index, the way transformers resolves them.
tdir = os.path.join(tmp, "toy/target")
index = json.load(open(os.path.join(tdir, "model.safetensors.index.json")))
tensors = {}
for name, fname in index["weight_map"].items():
    with safe_open(os.path.join(tdir, fname), framework="pt") as fh:
        tensors[name] = fh.get_tensor(name)
assert tensors["model.embed_tokens.weight"].shape == (V, H)
assert tensors["lm_head.weight"].shape == (V, H) and tensors["lm_head.weight"].dtype == torch.bfloat16
assert json.load(open(os.path.join(tdir, "config.json")))["hidden_size"] == H

# Native shards equal the .ckpt tensors (sample i = i-th sorted path).
nat = json.load(open(os.path.join(tmp, "native/features.index.json")))
assert nat["num_samples"] == 24 and len(nat["shards"]) >= 2
loaded = {}
for sh in nat["shards"]:
    loaded.update(load_file(os.path.join(tmp, "native", sh["file"])))
for i, f in enumerate(files):
    d = torch.load(f, weights_only=True)
    assert torch.equal(loaded[f"{i}.input_ids"], d["input_ids"])
    assert torch.equal(loaded[f"{i}.hidden_state"], d["hidden_state"][0])
    assert torch.equal(loaded[f"{i}.aux_hidden_state"], d["aux_hidden_state"][0])
print("data interop: ok")
PYEOF

# Resume: a second convert finds every shard complete and rewrites nothing.
before="$(stat -c %i "$TMP"/native/shard_00000.safetensors)"
"$BIN" convert --input "$TMP/toy/hidden_states" --output "$TMP/native" --shard-size 40K
after="$(stat -c %i "$TMP"/native/shard_00000.safetensors)"
[ "$before" = "$after" ] || { echo "resume rewrote a complete shard"; exit 1; }
echo "e2e data_interop: passed"
