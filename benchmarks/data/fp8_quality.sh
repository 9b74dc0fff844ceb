#!/usr/bin/env bash
# What fp8 feature storage (`convert --dtype fp8_e4m3`, lib/data/fp8.h) costs on real features:
# bytes on disk (.ckpt, native bf16, native fp8), the dequantisation error of the fp8 shards
# against bf16, and the held-out acceptance of drafts trained from each, with identical flags,
# seeds and batches and evaluated on the same held-out features. Plus the bytes of a larger
# synthetic set. Results: $OUTDIR/results.json and Markdown tables on stdout (docs/benchmarks.md).
#   bash benchmarks/data/fp8_quality.sh BUILD [OUTDIR]
#   (after launch/setup.sh and one run of the serving tier or benchmarks/serving/run.sh, which
#   cache the SmolLM2-135M features under ~/.cache/fsdp-train/serving/<key>)
#   SEEDS ("0 1 2"), EPOCHS (6), TTT (7), TOY_SAMPLES (400), TOY_HIDDEN (576), FEATURES (the cache
#   directory) override the defaults.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 BUILD [OUTDIR]"; exit 2; }
BUILD="$(cd "$1" && pwd)"
BIN="$BUILD/fsdp-train"
OUT="${2:-$BUILD/fp8_quality}"
PY="${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}/bin/python"
SEEDS="${SEEDS:-0 1 2}" EPOCHS="${EPOCHS:-6}" TTT="${TTT:-7}"
TOY_SAMPLES="${TOY_SAMPLES:-400}" TOY_HIDDEN="${TOY_HIDDEN:-576}"
for f in "$BIN" "$PY"; do
  [ -x "$f" ] || { echo "error: $f missing"; echo "---> HINT: run launch/setup.sh"; exit 2; }
done
if [ -z "${FEATURES:-}" ]; then
  SRC="$REPO" PIPE="$REPO/benchmarks/serving/pipeline.py"
  source "$REPO/benchmarks/serving/cache.sh"
  FEATURES="$(serving_cache_dir)"
fi
C="$FEATURES"
for d in target draft-config.json feat-train feat-eval; do
  [ -e "$C/$d" ] || { echo "error: $C/$d missing"; echo "---> HINT: run tests/serving/vllm_acceptance.sh or benchmarks/serving/run.sh once"; exit 2; }
done
rm -rf "$OUT"
mkdir -p "$OUT"
t0=$(date +%s)
stage() { echo "[fp8-quality] $(( $(date +%s) - t0 ))s: $*"; }
run_logged() {  # LOG CMD...: run, keep the output in LOG, show its tail on failure
  local log="$1"; shift
  "$@" >"$log" 2>&1 || { tail -30 "$log"; echo "error: failed: $*"; exit 1; }
}

# 1. Native shards, bf16 (exact) and fp8, of the training and held-out features.
for set in train eval; do
  for dt in bf16 fp8_e4m3; do
    stage "convert feat-$set -> $dt"
    run_logged "$OUT/convert-$set-$dt.log" "$BIN" convert --input "$C/feat-$set" --output "$OUT/$set-$dt" --dtype "$dt"
  done
done

# 5. The larger synthetic set (bytes only).
stage "gen-toy-data: $TOY_SAMPLES samples, H = $TOY_HIDDEN"
run_logged "$OUT/toy-gen.log" "$BIN" gen-toy-data --out "$OUT/toy" --num-samples "$TOY_SAMPLES" \
  --hidden-size "$TOY_HIDDEN" --min-len 128 --max-len 256 --seed 0
for dt in bf16 fp8_e4m3; do
  stage "convert toy -> $dt"
  run_logged "$OUT/convert-toy-$dt.log" "$BIN" convert --input "$OUT/toy/hidden_states" --output "$OUT/toy-$dt" --dtype "$dt"
done

# 2 and 3. Bytes on disk and the dequantisation error (Python, safetensors).
stage "bytes and dequantisation error"
"$PY" - "$C" "$OUT" <<'PYEOF'
import json, os, sys
import torch
from safetensors import safe_open
C, out = sys.argv[1:]

def nbytes(d):  # apparent size of every file under d
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)

sizes = {}
for name, ckpt, nat in [("SmolLM2 train (48)", f"{C}/feat-train", f"{out}/train"),
                        ("SmolLM2 eval (12)", f"{C}/feat-eval", f"{out}/eval"),
                        ("synthetic", f"{out}/toy/hidden_states", f"{out}/toy")]:
    idx = json.load(open(f"{nat}-bf16/features.index.json"))
    sizes[name] = {"samples": idx["num_samples"], "hidden_size": idx["hidden_size"],
                   "tokens": sum(s["length"] for s in idx["samples"]),
                   "ckpt": nbytes(ckpt), "bf16": nbytes(f"{nat}-bf16"), "fp8": nbytes(f"{nat}-fp8_e4m3")}

def shards(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))

# Dequantise as lib/data/fp8.h documents: bf16(q * scale), one fp32 scale per row and group of
# W / G columns (G = the captured layers of aux_hidden_state, 1 for hidden_state).
err = {}
for split in ["train", "eval"]:
    ref = {}
    for p in shards(f"{out}/{split}-bf16"):
        with safe_open(p, "pt") as f:
            for k in f.keys():
                if k.endswith("hidden_state"):
                    ref[k] = f.get_tensor(k).float()
    acc = {}
    for p in shards(f"{out}/{split}-fp8_e4m3"):
        with safe_open(p, "pt") as f:
            for k in f.keys():
                if not k.endswith("hidden_state"):
                    continue
                q, s = f.get_tensor(k), f.get_tensor(k + "_scale")
                S, W = q.shape
                G = s.shape[1]
                deq = (q.float().view(S, G, W // G) * s.view(S, G, 1)).to(torch.bfloat16).float().view(S, W)
                x = ref[k]
                kind = k.split(".", 1)[1]
                a = acc.setdefault(kind, {"sq_err": 0.0, "sq_ref": 0.0, "row_rel_max": 0.0, "row_rel_sum": 0.0,
                                          "rows": 0, "el_rel_max": 0.0, "el_rel_sum": 0.0, "els": 0,
                                          "abs_over_amax_max": 0.0, "exact": 0, "all": 0})
                d = deq - x
                a["sq_err"] += float((d * d).sum()); a["sq_ref"] += float((x * x).sum())
                rr = d.norm(dim=1) / x.norm(dim=1).clamp_min(1e-30)
                a["row_rel_max"] = max(a["row_rel_max"], float(rr.max())); a["row_rel_sum"] += float(rr.sum())
                a["rows"] += S
                # Element-wise relative error where E4M3 is in its normal range (|x| >= 2^-6 of the
                # row group's amax); below that the subnormal step dominates, see abs_over_amax.
                amax = x.abs().view(S, G, W // G).amax(dim=2, keepdim=True).expand(S, G, W // G).reshape(S, W)
                m = x.abs() >= amax * 2.0 ** -6
                er = (d.abs() / x.abs().clamp_min(1e-30))[m]
                a["el_rel_max"] = max(a["el_rel_max"], float(er.max())); a["el_rel_sum"] += float(er.sum())
                a["els"] += int(m.sum())
                a["abs_over_amax_max"] = max(a["abs_over_amax_max"], float((d.abs() / amax.clamp_min(1e-30)).max()))
                a["exact"] += int((d == 0).sum()); a["all"] += d.numel()
    for kind, a in acc.items():
        err[f"{split}/{kind}"] = {
            "rel_l2": (a["sq_err"] / a["sq_ref"]) ** 0.5,
            "row_rel_l2_mean": a["row_rel_sum"] / a["rows"], "row_rel_l2_max": a["row_rel_max"],
            "elem_rel_mean": a["el_rel_sum"] / a["els"], "elem_rel_max": a["el_rel_max"],
            "elem_normal_share": a["els"] / a["all"],
            "abs_err_over_amax_max": a["abs_over_amax_max"], "bit_exact_share": a["exact"] / a["all"]}
# Reference for the size of these errors: the held-out .ckpt features are fp32 (the serving
# pipeline writes them so); the error of bf16 and of fp8 shards against them.
idx = json.load(open(f"{out}/eval-bf16/features.index.json"))
orig = {}
for i, smp in enumerate(idx["samples"]):
    d = torch.load(os.path.join(f"{C}/feat-eval", smp["source"]), weights_only=False, map_location="cpu")
    for kind in ["hidden_state", "aux_hidden_state"]:
        orig[f"{i}.{kind}"] = d[kind].reshape(-1, d[kind].shape[-1]).float()
if all(v.dtype == torch.float32 for v in orig.values()):
    for dt in ["bf16", "fp8_e4m3"]:
        sq = {}
        for p in shards(f"{out}/eval-{dt}"):
            with safe_open(p, "pt") as f:
                for k in f.keys():
                    if not k.endswith("hidden_state"):
                        continue
                    t = f.get_tensor(k)
                    if dt == "fp8_e4m3":
                        s = f.get_tensor(k + "_scale"); S, W = t.shape; G = s.shape[1]
                        t = (t.float().view(S, G, W // G) * s.view(S, G, 1)).to(torch.bfloat16).view(S, W)
                    x = orig[k]; dd = t.float() - x
                    a = sq.setdefault(k.split(".", 1)[1], [0.0, 0.0, 0.0, 0])
                    a[0] += float((dd * dd).sum()); a[1] += float((x * x).sum())
                    a[2] += float((dd.norm(dim=1) / x.norm(dim=1).clamp_min(1e-30)).sum()); a[3] += x.shape[0]
        for kind, a in sq.items():
            err[f"eval/{kind}: {dt} vs the fp32 .ckpt"] = {"rel_l2": (a[0] / a[1]) ** 0.5, "row_rel_l2_mean": a[2] / a[3]}
json.dump({"bytes": sizes, "dequant_error": err}, open(f"{out}/storage.json", "w"), indent=1)

mib = lambda b: f"{b / 2**20:.2f} MiB"
print("\n| features | samples, tokens, H | .ckpt | native bf16 | native fp8 | fp8 / bf16 | fp8 / .ckpt |")
print("|---|---|---|---|---|---|---|")
for n, s in sizes.items():
    print(f"| {n} | {s['samples']}, {s['tokens']}, {s['hidden_size']} | {mib(s['ckpt'])} | {mib(s['bf16'])} | "
          f"{mib(s['fp8'])} | **{s['fp8'] / s['bf16']:.3f}** | {s['fp8'] / s['ckpt']:.3f} |")
print("\n| tensor | relative L2 (all) | per-row relative L2 mean / max | element relative error mean / max (|x| >= amax/64) | share of such elements | max abs error / row amax | elements exact |")
print("|---|---|---|---|---|---|---|")
for k, e in err.items():
    if "elem_rel_mean" not in e:
        print(f"| {k} | {e['rel_l2']:.4f} | {e['row_rel_l2_mean']:.4f} / - | - | - | - | - |")
        continue
    print(f"| {k} | {e['rel_l2']:.4f} | {e['row_rel_l2_mean']:.4f} / {e['row_rel_l2_max']:.4f} | "
          f"{e['elem_rel_mean']:.4f} / {e['elem_rel_max']:.4f} | {e['elem_normal_share']:.3f} | "
          f"{e['abs_err_over_amax_max']:.5f} | {e['bit_exact_share']:.3f} |")
PYEOF

# 4. Drafts trained from bf16 and from fp8 training features: the serving tier's training flags
# (benchmarks/serving/run.sh) except the TTT length (7, so that acc_0..acc_6 exist), identical
# seed and batches; every draft is evaluated (--eval-only, fp32, as the serving tier does) on the
# bf16 held-out features, and also on the fp8 ones and on the original .ckpt ones (the serving
# tier's held-out features, which its pipeline writes in fp32).
for seed in $SEEDS; do
  for dt in bf16 fp8_e4m3; do
    r="$OUT/seed$seed-$dt"
    stage "seed $seed: training on $dt features ($EPOCHS epochs, TTT $TTT)"
    run_logged "$r.train.log" "$BIN" --target-model-path "$C/target" --draft-model-config "$C/draft-config.json" \
      --train-hidden-states-path "$OUT/train-$dt" --output-dir "$r/run" --cache-dir "$r/cache" \
      --num-epochs "$EPOCHS" --draft-global-batch-size 4 --draft-micro-batch-size 4 --learning-rate 2e-3 \
      --warmup-ratio 0.05 --max-length 256 --ttt-length "$TTT" --export-dtype fp32 --save-interval 0 \
      --log-steps 50 --seed "$seed"
    ck="$(ls -d "$r/run"/epoch_* | sort -V | tail -n 1)"
    for ev in bf16 fp8_e4m3 ckpt; do
      stage "seed $seed: $dt draft on $ev held-out features"
      evdir="$OUT/eval-$ev"; [ $ev = ckpt ] && evdir="$C/feat-eval"
      run_logged "$r.eval-$ev.log" "$BIN" --init-checkpoint "$ck" --eval-only --target-model-path "$C/target" \
        --draft-model-config "$ck/config.json" --eval-hidden-states-path "$evdir" --cache-dir "$r/cache" \
        --max-length 512 --ttt-length "$TTT" --mixed-precision fp32 --draft-global-batch-size 1 \
        --draft-micro-batch-size 1 --output-dir "$r/eval-$ev"
    done
  done
done
stage "done"

"$PY" - "$OUT" "$TTT" $SEEDS <<'PYEOF'
import json, statistics, sys
out, ttt, seeds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
keys = [f"eval/acc_{i}" for i in range(ttt)] + ["eval/accept_len"]
def metrics(seed, train, ev):
    rows = [json.loads(l) for l in open(f"{out}/seed{seed}-{train}/eval-{ev}/metrics.jsonl") if "eval/accept_len" in l]
    return {k: rows[-1][k] for k in keys}
res = {s: {f"{t}->{e}": metrics(s, t, e) for t in ["bf16", "fp8_e4m3"] for e in ["bf16", "fp8_e4m3", "ckpt"]} for s in seeds}
storage = json.load(open(f"{out}/storage.json"))
json.dump({"storage": storage, "ttt": ttt, "seeds": seeds, "held_out": res}, open(f"{out}/results.json", "w"), indent=1)
short = [k.split("/")[1] for k in keys]
print("\nheld-out metrics (train features -> eval features), --eval-only fp32")
print("| seed | draft trained on -> evaluated on | " + " | ".join(short) + " |")
print("|---|---|" + "---|" * len(keys))
for s in seeds:
    for name, m in res[s].items():
        print(f"| {s} | {name} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")
    d = {k: res[s]["fp8_e4m3->bf16"][k] - res[s]["bf16->bf16"][k] for k in keys}
    print(f"| {s} | fp8 - bf16 (both on bf16 eval) | " + " | ".join(f"{d[k]:+.4f}" for k in keys) + " |")
if len(seeds) > 1:
    col = lambda name, k: [res[s][name][k] for s in seeds]
    print("\nover seeds " + ", ".join(seeds) + " (evaluated on the bf16 held-out features)")
    print("| | " + " | ".join(short) + " |")
    print("|---|" + "---|" * len(keys))
    for name in ["bf16->bf16", "fp8_e4m3->bf16"]:
        print(f"| {name.split('->')[0]} mean | " + " | ".join(f"{statistics.mean(col(name, k)):.4f}" for k in keys) + " |")
    print("| fp8 - bf16, mean of per-seed differences | " + " | ".join(
        f"{statistics.mean(a - b for a, b in zip(col('fp8_e4m3->bf16', k), col('bf16->bf16', k))):+.4f}" for k in keys) + " |")
    print("| fp8 - bf16, largest per-seed |difference| | " + " | ".join(
        f"{max(abs(a - b) for a, b in zip(col('fp8_e4m3->bf16', k), col('bf16->bf16', k))):.4f}" for k in keys) + " |")
    print("| bf16 seed spread (max - min) | " + " | ".join(f"{max(col('bf16->bf16', k)) - min(col('bf16->bf16', k)):.4f}" for k in keys) + " |")
    print("| bf16 seed std | " + " | ".join(f"{statistics.stdev(col('bf16->bf16', k)):.4f}" for k in keys) + " |")
PYEOF
