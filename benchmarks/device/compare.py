"""Summarises the GPU benchmark of run.sh: tokens/s, MFU and peak memory of fsdp-train and of
the PyTorch FSDP2 reference on the same GPU, from their metrics.jsonl files, and the ratios.
The first logged window of each run (warm-up, allocator growth) is left out when later ones
exist. MFU = model FLOPs per step (the same closed form for both trainers) / time / 989 TFLOP/s
(H100/H200 dense bf16). That count is the dense formulation (every row through the draft and
target heads), i.e. what the reference executes; fsdp-train runs the heads only on loss-mask
rows, so for it the script also prints the MFU of the FLOPs it executed (its own perf/mfu).

compare.py OURS.jsonl REFERENCE.jsonl DRAFT_CONFIG.json SEQ [NAME]   (NAME: the second trainer's,
                                          default "reference"; run.sh: "deepspeed-z3")
compare.py --checkpointing PLAIN.jsonl CHECKPOINTED.jsonl   (two fsdp-train runs)"""
import json
import sys

PEAK = 989e12


def rows(path):
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except FileNotFoundError:
        return []


def step_flops(cfg, B, S, T):
    # Mirrors lib/model/flops.cpp: matmuls (2 FLOPs per MAC), fwd + bwd (2x, fc 1x), attention
    # over S(S+1)/2 causal pairs plus i diagonal keys per query, target head (Vd + V rows).
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or H // nh
    V = cfg["vocab_size"]
    Vd = cfg.get("draft_vocab_size") or V
    Ht = cfg.get("target_hidden_size") or H
    tok = B * S
    fc = 2 * tok * 3 * Ht * H
    layer = 2 * tok * (2 * H * (nh * d + 2 * nkv * d) + nh * d * H + 3 * H * I) + 2 * tok * H * Vd
    attn = sum(2 * 2 * B * nh * d * (S * (S + 1) / 2 + i * S) for i in range(T))
    fwd = fc + T * layer + attn
    bwd = fc + 2 * (T * layer + attn)
    head = 2 * tok * Ht * (V + Vd)
    return fwd + bwd + head


def steady(path):
    """(tokens/s averaged over the logged windows after the first, peak device GiB)."""
    data = [x for x in rows(path) if "perf/tokens_per_s" in x]
    data = data[1:] if len(data) > 1 else data
    if not data:
        return None
    tps = sum(x["perf/tokens_per_s"] for x in data) / len(data)
    mem = max(x.get("mem/device_peak_allocated_gib", 0) for x in data)
    return tps, mem, {x["step"]: x.get("train/ploss_0") for x in data if "step" in x}


def checkpointing(plain_path, ckpt_path):
    a, b = steady(plain_path), steady(ckpt_path)
    if not a or not b:
        print("checkpointing: no measurements (see the logs)")
        return
    print(f"plain        tokens/s {a[0]:10.0f}   peak GPU memory {a[1]:6.1f} GiB")
    print(f"checkpointed tokens/s {b[0]:10.0f}   peak GPU memory {b[1]:6.1f} GiB")
    ratio_mem = b[1] / a[1] if a[1] else float("nan")
    print(f"checkpointed / plain: tokens/s {b[0] / a[0]:.2f}x, peak memory {ratio_mem:.2f}x")
    common = [s for s in a[2] if s in b[2] and a[2][s] is not None and b[2][s] is not None]
    if common:
        worst = max(abs(a[2][s] - b[2][s]) / max(abs(a[2][s]), 1e-30) for s in common)
        print(f"train/ploss_0 at steps {common}: worst relative difference {worst:.2e}")


def main():
    if sys.argv[1] == "--checkpointing":
        return checkpointing(sys.argv[2], sys.argv[3])
    ours, ref = rows(sys.argv[1]), rows(sys.argv[2])
    cfg = json.load(open(sys.argv[3]))
    S, T = int(sys.argv[4]), 7
    other = sys.argv[5] if len(sys.argv) > 5 else "reference"
    flops = step_flops(cfg, 1, S, T)

    o = [r for r in ours if "perf/tokens_per_s" in r]
    o = o[1:] if len(o) > 1 else o
    r = [x for x in ref if "perf/tokens_per_s" in x]
    r = r[2:] if len(r) > 2 else r
    print(f"llama3-8B-eagle3 draft, S={S}, T={T}, micro-batch 1, bf16, 1 GPU")
    print(f"model FLOPs per step: {flops / 1e12:.2f} TFLOP")
    res = {}
    for name, data in (("fsdp-train", o), (other, r)):
        if not data:
            print(f"{name:12s} no measurements (see its log)")
            continue
        tps = sum(x["perf/tokens_per_s"] for x in data) / len(data)
        mfu = tps / S * flops / PEAK
        mem = max((x.get("mem/device_peak_allocated_gib", 0) for x in data), default=0)
        if name == other:
            mem = max((x.get("mem/cuda_peak_allocated_gib", 0) for x in data), default=mem)
        res[name] = (tps, mfu, mem)
        print(f"{name:12s} tokens/s {tps:10.0f}   MFU {100 * mfu:5.1f}%   peak GPU memory {mem:6.1f} GiB")
        executed = [x["perf/mfu"] for x in data if "perf/mfu" in x]
        if name == "fsdp-train" and executed:
            print(f"{'':12s} MFU of the FLOPs fsdp-train executed (heads on loss rows only): "
                  f"{100 * sum(executed) / len(executed):5.1f}%")
    if len(res) == 2:
        a, b = res["fsdp-train"], res[other]
        print(f"ratio fsdp-train / {other}: tokens/s {a[0] / b[0]:.2f}x, memory "
              f"{(a[2] / b[2]) if b[2] else float('nan'):.2f}x")


if __name__ == "__main__":
    main()
