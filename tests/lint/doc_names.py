#!/usr/bin/env python3
"""lint.doc_names: every flag, subcommand and metric key the docs name still exists.

Scans README.md and docs/*.md for `--flag`s, `fsdp-train <subcommand>`s and metric keys
(train/..., train_epoch/..., eval/..., perf/..., mem/...) and fails on a name the program no
longer knows. The sources of truth are live, never a copied list:
  flags and subcommands: `fsdp-train --help` and `fsdp-train <subcommand> --help` (the option
    table, the subcommands' own options and the launcher's flags the root help names);
  metric keys: the keys a short toy run (train, epoch and evaluation records, MFU on) writes to
    metrics.jsonl; a key such a run cannot emit (a GPU's memory) passes when the code in lib/
    still spells it in full ("mem/device_peak_allocated_gib").
Flags of other tools are told apart by context: on a line or code span, the command word that
precedes the flag owns it (mpirun's `--hostfile` before `fsdp-train`, vLLM's after `vllm
serve`); tests/lint/doc_names_other_tools.txt lists the other tools' command words and the few
flags docs quote without their command.
Usage: doc_names.py REPO_ROOT BUILD_DIR. It first checks itself on planted stale names.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

FLAG = re.compile(r"(?<![A-Za-z0-9_-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# A metric key: a known prefix, then the name; placeholders <i>, <phase>, _i, _0..6 allowed.
METRIC = re.compile(
    r"(?<![A-Za-z0-9_./~<>-])((?:train_epoch|train|eval|perf|mem)/[A-Za-z0-9_<>]+(?:\.\.[0-9]+)?)"
    r"(?![A-Za-z0-9_/.<>-]*[A-Za-z0-9_/<>])")
SUBCOMMAND = re.compile(r"(?<![A-Za-z0-9_-])(?:[\w./-]*/)?fsdp-train[ \t]+([a-z][a-z0-9-]*)")
OURS = re.compile(r"(?<![A-Za-z0-9_-])(?:[\w./-]*/)?fsdp-train(?:-core)?(?![A-Za-z0-9_'/-])")


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def known_names(binary):
    """Flags and subcommands from the program's own help."""
    root = run([binary, "--help"])
    if root.returncode != 0:
        sys.exit(f"FAIL: {binary} --help exited {root.returncode}: {root.stderr[-400:]}")
    subs = []
    in_subs = False
    for line in root.stdout.splitlines():
        if line.startswith("Subcommands:"):
            in_subs = True
            continue
        if in_subs:
            m = re.match(r"^\s+([a-z][a-z0-9-]*)\s", line + " ")
            if not m:
                break
            subs.append(m.group(1))
    if not subs:
        sys.exit("FAIL: no 'Subcommands:' list in fsdp-train --help")
    text = root.stdout
    for s in subs:
        out = run([binary, s, "--help"])
        if out.returncode != 0:
            sys.exit(f"FAIL: fsdp-train {s} --help exited {out.returncode}")
        text += out.stdout
    return set(FLAG.findall(text)), set(subs)


def emitted_metrics(binary, work):
    """The metric keys of a toy run: training, epoch summary and evaluation records."""
    data, out = os.path.join(work, "data"), os.path.join(work, "run")
    gen = run([binary, "gen-toy-data", "--out", data, "--num-samples", "12", "--min-len", "24",
               "--max-len", "32", "--samples-per-dir", "4", "--seed", "3"])
    if gen.returncode != 0:
        sys.exit(f"FAIL: gen-toy-data: {gen.stdout[-400:]}{gen.stderr[-400:]}")
    rows = sorted(d for d in os.listdir(os.path.join(data, "hidden_states")) if d.startswith("rows_"))
    os.makedirs(os.path.join(data, "eval"))
    shutil.move(os.path.join(data, "hidden_states", rows[-1]), os.path.join(data, "eval"))
    train = run([binary, "--target-model-path", f"{data}/target",
                 "--draft-model-config", f"{data}/draft_config.json",
                 "--train-hidden-states-path", f"{data}/hidden_states",
                 "--eval-hidden-states-path", f"{data}/eval", "--cache-dir", f"{data}/cache",
                 "--output-dir", out, "--max-length", "32", "--ttt-length", "3",
                 "--draft-global-batch-size", "2", "--num-epochs", "1", "--eval-interval", "1",
                 "--log-steps", "1", "--save-interval", "0", "--save-final", "false",
                 "--mfu-peak-tflops", "1", "--device", "cpu", "--threads", "1"],
                env=dict(os.environ, OMP_NUM_THREADS="1"))
    if train.returncode != 0:
        sys.exit(f"FAIL: toy run exited {train.returncode}: {train.stdout[-800:]}{train.stderr[-800:]}")
    keys = set()
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            keys.update(k for k in json.loads(line) if "/" in k)
    for prefix in ("train/", "train_epoch/", "eval/", "perf/", "mem/"):
        if not any(k.startswith(prefix) for k in keys):
            sys.exit(f"FAIL: the toy run logged no {prefix} key: {sorted(keys)}")
    return keys


def spelled_in_code(root):
    """Every "prefix/name" string literal of lib/ and apps/ (keys a CPU run cannot emit)."""
    lit = re.compile(r'"((?:train_epoch|train|eval|perf|mem)/[A-Za-z0-9_]+)"')
    found = set()
    for top in ("lib", "apps"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if name.endswith((".cpp", ".h")):
                    with open(os.path.join(d, name), errors="replace") as f:
                        found.update(lit.findall(f.read()))
    return found


def metric_pattern(doc_key):
    """A doc's key as a regex over real keys: <x> is any name part, _i / _<i> / _0..6 any step."""
    k = re.sub(r"_(?:i|[0-9]+(?:\.\.[0-9]+)?)$", "_<i>", doc_key)
    parts = re.split(r"(<[^>]*>)", k)
    rx = "".join("[A-Za-z0-9_]+" if p.startswith("<") else re.escape(p) for p in parts)
    return re.compile("^" + rx + "$")


def load_other_tools(path):
    words, flags = [], set()
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.startswith("flag "):
                flags.add(line[5:].strip())
            elif line.startswith("tool "):
                words.append(line[5:].strip())
    tool_rx = re.compile(r"(?<![A-Za-z0-9_./-])(?:" + "|".join(words) + r")(?![A-Za-z0-9_-])",
                         re.IGNORECASE)
    return tool_rx, flags


def code_units(text):
    """(line number, text) units to scan: each fenced block's commands (backslash continuations
    joined) and every other line as it is."""
    units, fence, pending, start = [], False, "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            if pending:
                units.append((start, pending))
                pending = ""
            continue
        if fence:
            if not pending:
                start = n
            pending += line.rstrip("\\") + " "
            if not line.rstrip().endswith("\\"):
                units.append((start, pending))
                pending = ""
        else:
            units.append((n, line))
    return units


def owner_spans(unit, tool_rx):
    """Splits a unit into (text, ours) spans: text after an fsdp-train word is ours, after another
    tool's command word it is not, until the next command word; the start counts as ours."""
    marks = [(m.start(), True) for m in OURS.finditer(unit)]
    marks += [(m.start(), False) for m in tool_rx.finditer(unit)]
    marks.sort()
    spans, pos, ours = [], 0, True
    for at, who in marks:
        spans.append((unit[pos:at], ours))
        pos, ours = at, who
    spans.append((unit[pos:], ours))
    return spans


def inline_code(line):
    return re.findall(r"`([^`]+)`", line)


def scan(files, flags, subs, metric_ok, tool_rx, other_flags):
    """Returns a list of 'file:line: what' for every stale name."""
    bad = []
    for path in files:
        rel = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
        with open(path, errors="replace") as f:
            text = f.read()
        for n, unit in code_units(text):
            for span, ours in owner_spans(unit, tool_rx):
                if not ours:
                    continue
                for flag in FLAG.findall(span):
                    if flag not in flags and flag not in other_flags:
                        bad.append(f"{rel}:{n}: flag {flag} is not an option of fsdp-train")
            for m in METRIC.finditer(unit):
                key = m.group(1)
                if not metric_ok(key):
                    bad.append(f"{rel}:{n}: metric key {key} is not logged by fsdp-train")
        # Subcommands: only inside code (a fenced block or a code span), where the word after
        # fsdp-train is a command line's.
        fence = False
        for n, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            for piece in ([line] if fence else inline_code(line)):
                for sub in SUBCOMMAND.findall(piece):
                    if sub not in subs:
                        bad.append(f"{rel}:{n}: subcommand 'fsdp-train {sub}' does not exist")
    return bad


def doc_files(root):
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return [f for f in files if os.path.isfile(f)]


def self_check(check, flags, subs, some_metric):
    """Planted stale names must be found; their live neighbours must pass."""
    some_flag = sorted(flags)[0]
    good = (f"Run `fsdp-train {sorted(subs)[0]} --help` or `fsdp-train {some_flag} X`; "
            f"log `{some_metric}`.\n```\nmpirun --hostfile h -np 2 fsdp-train {some_flag} 1\n"
            f"vllm serve M --speculative-config '{{}}'\n```\n")
    planted = ["`--no-such-flag-planted 3`", "`fsdp-train no-such-subcommand --out x`",
               "`train/no_such_metric_planted`", "```\nmpirun -np 2 fsdp-train --planted-stale x\n```",
               "```\nbuild/fsdp-train --nproc-per-node 2 \\\n  --planted-after-continuation 1\n```"]
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        ok = os.path.join(d, "docs", "ok.md")
        with open(ok, "w") as f:
            f.write(good)
        if check([ok]):
            sys.exit("FAIL: the self-check flags a clean page:\n" + "\n".join(check([ok])))
        for i, text in enumerate(planted):
            p = os.path.join(d, "docs", f"planted{i}.md")
            with open(p, "w") as f:
                f.write(text + "\n")
            if not check([p]):
                sys.exit(f"FAIL: the self-check missed a planted stale name: {text!r}")


def main():
    root, build = sys.argv[1], sys.argv[2]
    binary = os.path.join(build, "fsdp-train")
    if not os.access(binary, os.X_OK):
        sys.exit(f"FAIL: {binary} is missing: build the fsdp-train target")
    flags, subs = known_names(binary)
    with tempfile.TemporaryDirectory() as work:
        metrics = emitted_metrics(binary, work)
    spelled = spelled_in_code(root)
    live = metrics | spelled

    def metric_ok(key):
        rx = metric_pattern(key)
        return any(rx.match(re.sub(r"_[0-9]+$", "_<i>", k)) or rx.match(k) for k in live)

    tool_rx, other_flags = load_other_tools(os.path.join(root, "tests", "lint",
                                                         "doc_names_other_tools.txt"))

    def check(files):
        return scan(files, flags, subs, metric_ok, tool_rx, other_flags)

    self_check(check, flags, subs, sorted(metrics)[0])
    files = doc_files(root)
    bad = check(files)
    print(f"doc_names: {len(flags)} flags, {len(subs)} subcommands, {len(metrics)} logged metric "
          f"keys (+{len(spelled - metrics)} spelled only in lib/); {len(files)} pages")
    if bad:
        print("\n".join(bad))
        print(f"FAIL: {len(bad)} stale name(s) in the docs: rename them to what the program has "
              "now, or drop them (a flag of another tool: see tests/lint/doc_names_other_tools.txt)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
