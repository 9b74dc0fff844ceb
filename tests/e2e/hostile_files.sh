#!/usr/bin/env bash
# Hostile and damaged feature files and training state through the binary (docs/security.md):
# each file is generated here with the venv's Python, none is checked in. A hostile feature file
# stops a run with exit 2 naming it (training and convert), is skipped and counted with
# --skip-bad-samples, and never crashes; a hostile training-state shard in the newest checkpoint
# makes --resume auto fall back to the previous complete one and --resume PATH exit 2.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/hostile_files"; rm -rf "$W"; mkdir -p "$W"
ARGS="$(train_args "$DATA" "$W/out") --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 --max-steps 2"
GOOD="$(head -n 1 <<<"$(ls "$DATA"/hidden_states/rows_*/*.ckpt)")"

# make_hostile KIND OUT: a feature file of one kind of damage, derived from a good sample.
make_hostile() {
  "$PY" - "$GOOD" "$1" "$2" <<'PYEOF'
# Writes a torch.save-shaped archive with our own pickle (the layout torch.save uses) so that
# each kind of damage is one changed field, whatever writer made the good sample.
import struct, sys, zipfile, zlib
import torch
good, kind, out = sys.argv[1:]
sample = torch.load(good, weights_only=True) if kind not in ("deep", "global") else {}
STORAGE = {torch.int64: "LongStorage", torch.int32: "IntStorage", torch.bool: "BoolStorage",
           torch.uint8: "ByteStorage", torch.bfloat16: "BFloat16Storage", torch.float16: "HalfStorage",
           torch.float32: "FloatStorage"}

def s(x):
    b = x.encode(); return b"X" + struct.pack("<I", len(b)) + b
def i(v):
    return b"\x8a\x08" + struct.pack("<q", v)
def tup(vs):
    return b"(" + b"".join(i(v) for v in vs) + b"t"

records, pickle = {}, b"\x80\x02}("
for n, (key, t) in enumerate(sample.items()):
    t = t.contiguous()
    data = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.to(torch.uint8).numpy().tobytes()
    numel, offset, sizes, strides = t.numel(), 0, list(t.shape), list(t.stride())
    if key == "input_ids" and kind == "stride": strides[-1] = 1 << 40
    if key == "input_ids" and kind == "offset": offset = -5
    if key == "hidden_state" and kind == "shape": data = data[: len(data) // 2]; numel //= 2
    if key == "input_ids" and kind == "numel": numel = 10 ** 12
    records[str(n)] = data
    pickle += s(key) + b"ctorch._utils\n_rebuild_tensor_v2\n(" + b"(" + s("storage") + \
        b"ctorch\n" + STORAGE[t.dtype].encode() + b"\n" + s(str(n)) + s("cpu") + i(numel) + b"tQ" + \
        i(offset) + tup(sizes) + tup(strides) + b"\x89ccollections\nOrderedDict\n)RtR"
pickle += b"u."
if kind == "deep":          # a million nested lists
    pickle = b"\x80\x02" + b"]" * 1000000 + b"a" * 999999 + b"."
if kind == "global":        # a payload naming os.system
    pickle = b"\x80\x02cos\nsystem\n" + s("true") + b"\x85R."
members = [("archive/data.pkl", pickle), ("archive/byteorder", b"little")] + \
          [("archive/data/" + k, v) for k, v in records.items()]
if kind == "bomb":          # a 3 GiB record of zeros, deflated to ~3 MB
    members.append(("archive/data/bomb", None))
if kind == "flip":
    big = max(records, key=lambda k: len(records[k]))

# A plain zip writer: stored members, or the bomb's deflated stream with its true CRC.
body, central = b"", b""
for name, data in members:
    nb = name.encode()
    if data is None:
        n, chunk = 3 << 30, b"\0" * (64 << 20)
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        comp, crc = b"", 0
        for _ in range(n // len(chunk)):
            comp += c.compress(chunk); crc = zlib.crc32(chunk, crc)
        comp += c.flush(); method, size = 8, n
    else:
        comp, crc, method, size = data, zlib.crc32(data), 0, len(data)
        if kind == "flip" and name == "archive/data/" + big:
            b = bytearray(data); b[len(b) // 2] ^= 1; comp = bytes(b)   # CRC of the original
    off = len(body)
    body += struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, method, 0, 0, crc, len(comp), size, len(nb), 0) + nb + comp
    central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 20, 20, 0, method, 0, 0, crc, len(comp), size,
                           len(nb), 0, 0, 0, 0, 0, off) + nb
end = struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, len(members), len(members), len(central), len(body), 0)
open(out, "wb").write(body + central + end)
PYEOF
}

for kind in deep stride offset shape numel bomb flip global; do
  D="$W/data_$kind"; mkdir -p "$D"
  cp -r "$DATA/hidden_states/." "$D/"
  BAD="$(ls "$D"/rows_*/*.ckpt | sed -n 3p)"
  make_hostile "$kind" "$BAD" || fail "making the $kind file"
  expect_usage_error "$kind" /usr/bin/time -f 'maxrss_kb %M' "$BIN" $ARGS --train-hidden-states-path "$D" --output-dir "$W/o_$kind"
  [ "$(grep -c -- "$BAD" <<<"$out")" -ge 1 ] || { tail -5 <<<"$out"; fail "$kind: the file is not named"; }
  rss=$(sed -n 's/^maxrss_kb //p' <<<"$out")
  [ "${rss:-0}" -lt 1500000 ] || fail "$kind: peak RSS ${rss} kB (a bomb was expanded?)"
  # Skipped and counted with --skip-bad-samples; the run ends normally.
  out="$("$BIN" $ARGS --train-hidden-states-path "$D" --output-dir "$W/s_$kind" --skip-bad-samples 2>&1)"; rc=$?
  [ $rc -eq 0 ] || { tail -5 <<<"$out"; fail "$kind: --skip-bad-samples exit $rc"; }
  # convert refuses it naming the file.
  expect_usage_error "$kind: convert" "$BIN" convert --input "$D" --output "$W/c_$kind"
  [ "$(grep -c -- "$BAD" <<<"$out")" -ge 1 ] || { tail -5 <<<"$out"; fail "$kind: convert does not name the file"; }
  echo "ok: $kind (peak RSS ${rss} kB)"
  rm -rf "$D" "$W/c_$kind"
done

# The deep-nesting pickle as a training-state shard of the newest checkpoint.
"$BIN" $ARGS --max-steps 4 --save-steps 2 --output-dir "$W/ck" >"$W/ck.log" 2>&1 || { tail "$W/ck.log"; fail "checkpointed run"; }
NEWEST="$(head -n 1 <<<"$(ls -d "$W"/ck/epoch_*_step_4)")"
[ -d "$NEWEST/train_state" ] || fail "no train_state in $NEWEST"
SHARD="$(head -n 1 <<<"$(ls "$NEWEST"/train_state/shard_*.pt)")"
GOOD="$SHARD" make_hostile deep "$W/deep_shard.pt" || fail "making the hostile shard"
cp "$W/deep_shard.pt" "$SHARD"
cp -r "$NEWEST" "$W/damaged_ckpt"   # --resume auto may set the damaged one aside
out="$("$BIN" $ARGS --max-steps 5 --output-dir "$W/ck" --resume 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "step_2" <<<"$out")" -ge 1 ] || { tail -8 <<<"$out"; fail "--resume auto did not fall back past the hostile shard (exit $rc)"; }
expect_usage_error "--resume PATH on a hostile shard" "$BIN" $ARGS --max-steps 5 --output-dir "$W/ck2" --resume "$W/damaged_ckpt"
[ "$(grep -c -- "shard_" <<<"$out")" -ge 1 ] || { tail -8 <<<"$out"; fail "--resume PATH on a hostile shard: the shard is not named"; }
echo "ok: hostile training-state shard"
echo "PASS"
