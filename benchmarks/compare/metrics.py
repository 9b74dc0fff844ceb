#!/usr/bin/env python3
# Reads the metrics.jsonl of both trainers (reference: benchmarks/reference/train.py; fsdp-train:
# --output-dir/metrics.jsonl) and prints parity checks and benchmark tables. Only compares what
# the runs wrote; never invents, rounds away or hard-codes a number.
"""metrics.py parity A.jsonl B.jsonl [--steps N] [--rtol R]   exit 1 when a value differs
metrics.py perf RUN.jsonl                                     steady-state summary as JSON
metrics.py eval RUN.jsonl                                     last eval/acc_i as JSON
metrics.py table SUMMARY.json                                 markdown tables of bench.sh"""

import argparse
import json
import math
import sys


def read_lines(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{n}: not JSON ({e})")
    return out


def step_records(path):
    """Per-step training records keyed by step (the last record wins if a step repeats)."""
    recs = {}
    for r in read_lines(path):
        if isinstance(r.get("step"), int) and any(k.startswith("train/ploss_") for k in r):
            recs[r["step"]] = r
    return recs


def parity(args):
    a, b = step_records(args.a), step_records(args.b)
    steps = sorted(set(a) & set(b))[: args.steps]
    if not steps:
        sys.exit(f"error: no common training steps in {args.a} and {args.b}")
    keys = sorted(k for k in a[steps[0]] if k.startswith(("train/ploss_", "train/acc_"))
                  and k in b[steps[0]])
    if not keys:
        sys.exit("error: no common train/ploss_i or train/acc_i keys")
    worst, failed = 0.0, []
    print(f"{'step':>4} {'key':<16} {'A':>14} {'B':>14} {'rel diff':>10}")
    for s in steps:
        for k in keys:
            x, y = float(a[s][k]), float(b[s][k])
            diff = abs(x - y)
            rel = diff / max(abs(x), abs(y), 1e-30)
            ok = math.isfinite(x) and math.isfinite(y) and (diff <= args.atol or rel <= args.rtol)
            if max(abs(x), abs(y)) > args.atol:  # relative error is meaningless near zero
                worst = max(worst, rel)
            if not ok or args.verbose:
                print(f"{s:>4} {k:<16} {x:>14.8g} {y:>14.8g} {rel:>10.2e}{'' if ok else '  FAIL'}")
            if not ok:
                failed.append((s, k))
    print(f"parity: {len(steps)} steps x {len(keys)} keys, worst relative difference "
          f"{worst:.3e} (rtol {args.rtol:g}, atol {args.atol:g}): "
          f"{'PASS' if not failed else f'FAIL ({len(failed)} values)'}")
    return 1 if failed else 0


def perf_summary(path, skip=1):
    """Steady-state numbers from per-step lines; the first `skip` steps are warm-up."""
    recs = step_records(path)
    steps = sorted(recs)[skip:]
    if not steps:
        sys.exit(f"error: {path}: fewer than {skip + 1} logged steps")
    secs = tokens = 0.0
    rss = dev = 0.0
    for s in steps:
        r = recs[s]
        dt = r.get("perf/step_s", r.get("perf/step_time_s"))
        if dt is None:
            sys.exit(f"error: {path}: step {s} has neither perf/step_s nor perf/step_time_s")
        secs += dt
        tokens += r["perf/tokens"] if "perf/tokens" in r else r["perf/tokens_per_s"] * dt
    for r in recs.values():
        m = r.get("mem/peak_rss_mib")
        if isinstance(m, list):
            rss = max(rss, max(m))
        elif "mem/host_peak_rss_gib" in r:
            rss = max(rss, r["mem/host_peak_rss_gib"] * 1024)
        if "mem/device_peak_allocated_gib" in r:
            dev = max(dev, r["mem/device_peak_allocated_gib"] * 1024)
    out = {"steps": len(steps), "seconds": secs, "steps_per_s": len(steps) / secs,
           "tokens_per_s": tokens / secs, "peak_rss_mib_per_rank": rss}
    # fsdp-train's time breakdown (perf/<phase>_s per step): where the steady steps went.
    phases = ("data", "forward", "backward", "comm", "optimizer", "other")
    if all(f"perf/{ph}_s" in recs[s] for s in steps for ph in phases):
        out["breakdown_share"] = {
            ph: sum(recs[s][f"perf/{ph}_s"] for s in steps) / secs for ph in phases}
    if dev:
        out["peak_device_allocated_mib"] = dev
    return out


def eval_summary(path):
    last = {}
    for r in read_lines(path):
        if any(k.startswith("eval/acc_") for k in r):
            last = r
    if not last:
        sys.exit(f"error: {path}: no eval/acc_i record")
    return {k: last[k] for k in sorted(last) if k.startswith("eval/acc_")}


def trainers(runs):
    """The reference and fsdp-train first (always listed), then fsdp-train's other runs (packed,
    shard_grad_op), then any others (the DeepSpeed runs)."""
    names = {n for w in runs.values() for n in w} - {"reference", "fsdp-train"}
    ours = sorted(n for n in names if n.startswith("fsdp-train"))
    return ["reference", "fsdp-train"] + ours + sorted(names - set(ours), reverse=True)


def table(args):
    with open(args.summary) as f:
        s = json.load(f)
    names_all = trainers(s["runs"])
    print("| ranks | trainer | steps/s | tokens/s | peak RSS/rank (MiB) | tokens/s ratio |")
    print("|---|---|---|---|---|---|")
    for w in sorted(s["runs"], key=int):
        runs = s["runs"][w]
        ref = runs.get("reference", {}).get("perf")
        for name in names_all:
            p = runs.get(name, {}).get("perf")
            if not p and name not in ("reference", "fsdp-train"):
                continue
            if not p:
                print(f"| {w} | {name} | not run | | | |")
                continue
            ratio = f"{p['tokens_per_s'] / ref['tokens_per_s']:.2f}" if ref else ""
            print(f"| {w} | {name} | {p['steps_per_s']:.4f} | {p['tokens_per_s']:.1f} | "
                  f"{p['peak_rss_mib_per_rank']:.0f} | {ratio} |")
    print()
    split = [(w, n, s["runs"][w][n]["perf"]["breakdown_share"]) for w in sorted(s["runs"], key=int)
             for n in names_all if "breakdown_share" in s["runs"][w].get(n, {}).get("perf", {})]
    if split:
        phases = list(split[0][2])
        print("| ranks | trainer | " + " | ".join(phases) + " |")
        print("|---|---|" + "---|" * len(phases))
        for w, n, b in split:
            print(f"| {w} | {n} | " + " | ".join(f"{100 * b[ph]:.0f}%" for ph in phases) + " |")
        print()
    names = [(w, n) for w in sorted(s["runs"], key=int) for n in names_all
             if s["runs"][w].get(n, {}).get("eval")]
    if names:
        T = len(s["runs"][names[0][0]][names[0][1]]["eval"])
        print("| ranks | trainer | " + " | ".join(f"acc_{i}" for i in range(T)) + " |")
        print("|---|---|" + "---|" * T)
        for w, n in names:
            e = s["runs"][w][n]["eval"]
            cells = " | ".join(f"{e[f'eval/acc_{i}']:.4f}" for i in range(T))
            print(f"| {w} | {n} | {cells} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parity")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-7, help="absolute floor (acc of 0 vs 1e-9)")
    p.add_argument("--verbose", action="store_true")
    q = sub.add_parser("perf")
    q.add_argument("run")
    q.add_argument("--skip", type=int, default=1)
    e = sub.add_parser("eval")
    e.add_argument("run")
    t = sub.add_parser("table")
    t.add_argument("summary")
    args = ap.parse_args()
    if args.cmd == "parity":
        sys.exit(parity(args))
    if args.cmd == "perf":
        print(json.dumps(perf_summary(args.run, args.skip)))
    elif args.cmd == "eval":
        print(json.dumps(eval_summary(args.run)))
    else:
        table(args)


if __name__ == "__main__":
    main()
