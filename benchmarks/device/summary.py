"""The numbers of one stage of benchmarks/device/run.sh, from its runs' metrics.jsonl files.
Steady state = the logged windows after the first (warm-up, allocator growth); tokens/s is the
tokens of those windows over their seconds. A missing file or window prints why, never a number.

summary.py fused FUSED.jsonl PLAIN.jsonl          --fused-cuda-kernels against the plain run
summary.py breakdown RUN.jsonl                    where a step's time goes (perf/<phase>_s)
summary.py packing FIXED.jsonl UNPACKED.jsonl PACKED.jsonl
summary.py offload OFFLOAD.jsonl PLAIN.jsonl
summary.py longctx RUN.jsonl LENGTH
summary.py dflash DFLASH.jsonl PLAIN.jsonl         a DFlash draft's step against the EAGLE3 run
summary.py muon MUON.jsonl PLAIN.jsonl             --optimizer muon's step against AdamW's"""
import json
import os
import sys

PHASES = ("forward", "backward", "comm", "optimizer", "data", "other")


def windows(path):
    if not os.path.exists(path):
        return None
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if "perf/tokens_per_s" in r and "perf/step_time_s" in r]
    return rows[1:] if len(rows) > 1 else rows


def steady(path):
    rows = windows(path)
    if not rows:
        return None
    secs = sum(r["perf/step_time_s"] for r in rows)
    tokens = sum(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in rows)
    out = {"tokens_per_s": tokens / secs if secs else 0.0, "windows": len(rows)}
    out["peak_gib"] = max(r.get("mem/device_peak_allocated_gib", 0.0) for r in rows)
    out["host_gib"] = max(r.get("mem/host_peak_rss_gib", 0.0) for r in rows)
    if all("perf/mfu" in r for r in rows):
        out["mfu"] = sum(r["perf/mfu"] for r in rows) / len(rows)
    out["ms"] = {p: 1e3 * sum(r.get(f"perf/{p}_s", 0.0) for r in rows) / len(rows) for p in PHASES}
    return out


def show(name, r):
    if r is None:
        print(f"{name}: no steady-state windows (see runs.log)")
        return
    mfu = f", MFU {100 * r['mfu']:.1f}%" if "mfu" in r else ""
    print(f"{name}: {r['tokens_per_s']:.0f} tokens/s{mfu}, peak device memory "
          f"{r['peak_gib']:.1f} GiB, host RSS {r['host_gib']:.1f} GiB ({r['windows']} windows)")


def ratio(label, a, b):
    if a and b and b["tokens_per_s"]:
        print(f"{label}: {a['tokens_per_s'] / b['tokens_per_s']:.3f}x tokens/s")


def main(argv):
    kind = argv[1]
    if kind == "fused":
        f, p = steady(argv[2]), steady(argv[3])
        show("fused kernels", f)
        show("plain", p)
        ratio("fused / plain", f, p)
        if f and p:
            print("per step ms, fused/plain: " +
                  ", ".join(f"{k} {f['ms'][k]:.1f}/{p['ms'][k]:.1f}" for k in PHASES))
    elif kind == "breakdown":
        r = steady(argv[2])
        if r:
            print("time per step (ms): " + ", ".join(f"{k} {r['ms'][k]:.1f}" for k in PHASES))
    elif kind == "packing":
        fixed, un, pk = (steady(p) for p in argv[2:5])
        for name, r in (("fixed length", fixed), ("chat unpacked", un), ("chat packed", pk)):
            show(name, r)
        ratio("packed / fixed length (goal >= 0.90)", pk, fixed)
        ratio("packed / unpacked", pk, un)
    elif kind == "offload":
        o, p = steady(argv[2]), steady(argv[3])
        show("cpu offload", o)
        ratio("offload / plain", o, p)
    elif kind == "longctx":
        rows = [json.loads(line) for line in open(argv[2])] if os.path.exists(argv[2]) else []
        peak = max((r.get("mem/device_peak_allocated_gib", 0.0) for r in rows), default=None)
        tps = [r["perf/tokens_per_s"] for r in rows if "perf/tokens_per_s" in r]
        if peak is None or not tps:
            print(f"S = {argv[3]}: no logged step (see runs.log)")
        else:
            print(f"S = {argv[3]}: peak device memory {peak:.1f} GiB, {tps[-1]:.0f} tokens/s")
    elif kind == "dflash":
        d, p = steady(argv[2]), steady(argv[3])
        show("dflash", d)
        rows = [json.loads(line) for line in open(argv[2])] if os.path.exists(argv[2]) else []
        rows = [r for r in rows if "train/loss" in r]
        if rows:
            print(f"dflash train/loss {rows[0]['train/loss']:.3f} -> {rows[-1]['train/loss']:.3f}, "
                  f"accept_len {rows[-1].get('train/accept_len', float('nan')):.3f}")
        ratio("dflash / eagle3 (same features and sequence length)", d, p)
    elif kind == "muon":
        m, p = steady(argv[2]), steady(argv[3])
        show("muon", m)
        if m and p:
            print(f"optimizer step ms, muon/adamw: {m['ms']['optimizer']:.1f}/{p['ms']['optimizer']:.1f}; "
                  f"peak device memory {m['peak_gib']:.2f}/{p['peak_gib']:.2f} GiB")
        ratio("muon / adamw tokens/s", m, p)
    else:
        sys.exit(f"summary.py: unknown kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv)
