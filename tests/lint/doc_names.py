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
CHECKED = {"flag": set(), "subcommand": set(), "metric": set()}  # distinct names checked
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


def load_other_tools(root, path):
    """The other tools' command words (a regex) and the names docs quote without one: each
    {name: owner}; an owner that is a repository file must still contain the name."""
    words, names = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].split()
            if len(line) == 2 and line[0] == "tool":
                words.append(line[1])
            elif len(line) == 3 and line[0] in ("flag", "metric"):
                names[line[1]] = line[2]
            elif line:
                sys.exit(f"FAIL: {path}:{n}: expected 'tool REGEX', 'flag --NAME OWNER' or "
                         "'metric KEY OWNER'")
    for name, owner in names.items():
        if owner.startswith("external:"):
            continue
        owner_path = os.path.join(root, owner)
        if not os.path.isfile(owner_path) or name not in open(owner_path, errors="replace").read():
            sys.exit(f"FAIL: {os.path.basename(path)}: {name} is listed as {owner}'s, which does "
                     "not have it (any more): drop the line, and the name from the docs")
    tool_rx = re.compile(r"(?<![A-Za-z0-9_./-])(?:" + "|".join(words) + r")(?![A-Za-z0-9_-])",
                         re.IGNORECASE)
    return tool_rx, names


def split_page(text):
    """(line number, command) for each command of the code blocks (fenced, or indented with
    backslash continuations; continuations joined), and (line number, paragraph) for the prose
    between them (a table row is a paragraph of its own)."""
    code, prose, fence, pending, para, start = [], [], False, "", "", 0

    def flush():
        nonlocal para
        if para:
            prose.append((start, para))
            para = ""

    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            flush()
            continue
        continued = pending or line.startswith("    ") and line.rstrip().endswith("\\")
        if fence or continued:
            flush()
            if not pending:
                start_code = n
            pending += line.rstrip().rstrip("\\") + " "
            if not line.rstrip().endswith("\\"):
                code.append((start_code, pending))
                pending = ""
            continue
        if not line.strip() or line.lstrip().startswith("|"):
            flush()
        if line.strip():
            if not para:
                start = n
            para += line + "\n"
            if line.lstrip().startswith("|"):
                flush()
    flush()
    return code, prose


# Where a command starts inside a code line or span: its start, or after | && || ; $( (.
COMMAND_START = re.compile(r"(?:^|\|\|?|&&|;|\$\(|\()\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*([^\s|;&()]+)")


def owner_spans(code, tool_rx, subs, ours=True):
    """Splits a command line or code span into (text, ours) spans. A command word owns what
    follows it up to the next one: fsdp-train (any path to it), one of its subcommands or a bare
    flag at a command's start are ours; another program at a command's start (bench_model,
    metrics.py, pip) and the other tools' words anywhere (mpirun ... fsdp-train) are not."""
    marks = [(m.start(), True) for m in OURS.finditer(code)]
    marks += [(m.start(), False) for m in tool_rx.finditer(code)]
    for m in COMMAND_START.finditer(code):
        word = m.group(1)
        if word.startswith("-"):
            continue  # a bare flag: owned by what precedes the code
        marks.append((m.start(1), bool(OURS.fullmatch(word)) or word in subs))
    marks.sort()
    spans, pos = [], 0
    for at, who in marks:
        spans.append((code[pos:at], ours))
        pos, ours = at, who
    spans.append((code[pos:], ours))
    return spans


# After `fsdp-train WORD` in a command: a flag, a placeholder, a path, an option group or nothing
# (`fsdp-train mlflow bridge: ...` quotes a message, not a command).
AFTER_SUBCOMMAND = re.compile(r"^(?:\s*$|\s+(?:-|[A-Z][A-Z_]*\b|\[|<|[\w.~-]*/))")


def stale_in_code(code, flags, subs, names, tool_rx, ours=True):
    bad = []
    for span, ours in owner_spans(code, tool_rx, subs, ours):
        if ours:
            CHECKED["flag"].update(FLAG.findall(span))
            bad += [f"flag {f} is not an option of fsdp-train" for f in FLAG.findall(span)
                    if f not in flags and f not in names]
    for m in SUBCOMMAND.finditer(code):
        if AFTER_SUBCOMMAND.match(code[m.end():]):
            CHECKED["subcommand"].add(m.group(1))
        if m.group(1) not in subs and AFTER_SUBCOMMAND.match(code[m.end():]):
            bad.append(f"subcommand 'fsdp-train {m.group(1)}' does not exist")
    return bad


def prose_owner(text, tool_rx):
    """Who owns a flag at the end of `text`: the last fsdp-train or other tool word, else ours."""
    marks = [(m.start(), True) for m in OURS.finditer(text)]
    marks += [(m.start(), False) for m in tool_rx.finditer(text)]
    return max(marks)[1] if marks else True


def scan(files, flags, subs, metric_ok, tool_rx, names):
    """Returns a list of 'file:line: what' for every stale name."""
    bad = []
    for path in files:
        rel = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
        rel = rel.split("/", 1)[1] if not rel.startswith("docs/") else rel
        with open(path, errors="replace") as f:
            text = f.read()
        code, prose = split_page(text)
        for n, cmd in code:
            bad += [f"{rel}:{n}: {what}" for what in stale_in_code(cmd, flags, subs, names, tool_rx)]
        for n, para in prose:
            line_of = lambda at: n + para.count("\n", 0, at)
            # Code spans: owned by the tool the prose names before them ("SGLang with `--x`"),
            # unless the span starts with a command of its own.
            for m in re.finditer(r"`([^`]+)`", para):
                ours = prose_owner(para[:m.start()], tool_rx)
                bad += [f"{rel}:{line_of(m.start())}: {w}"
                        for w in stale_in_code(m.group(1), flags, subs, names, tool_rx, ours)]
            # Flags in plain prose: the other tools' words still own what follows them.
            plain = re.sub(r"`[^`]+`", lambda m: " " * len(m.group(0)), para)
            pos = 0
            for span, ours in owner_spans(plain, tool_rx, set()):
                if ours:
                    bad += [f"{rel}:{line_of(pos + f.start())}: flag {f.group(0)} is not an "
                            "option of fsdp-train" for f in FLAG.finditer(span)
                            if f.group(0) not in flags and f.group(0) not in names]
                pos += len(span)
        for n, chunk in code + prose:
            for m in METRIC.finditer(chunk):
                CHECKED["metric"].add(m.group(1))
                if m.group(1) not in names and not metric_ok(m.group(1)):
                    bad.append(f"{rel}:{n + chunk.count(chr(10), 0, m.start())}: metric key "
                               f"{m.group(1)} is not logged by fsdp-train")
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

    tool_rx, names = load_other_tools(root, os.path.join(root, "tests", "lint",
                                                         "doc_names_other_tools.txt"))

    def check(files):
        return scan(files, flags, subs, metric_ok, tool_rx, names)

    self_check(check, flags, subs, sorted(metrics)[0])
    for names_checked in CHECKED.values():
        names_checked.clear()
    files = doc_files(root)
    bad = check(files)
    print(f"doc_names: the program has {len(flags)} flags, {len(subs)} subcommands, "
          f"{len(metrics)} logged metric keys (+{len(spelled - metrics)} spelled only in lib/); "
          f"{len(files)} pages name {len(CHECKED['flag'])} distinct flags (of fsdp-train), "
          f"{len(CHECKED['subcommand'])} subcommands, {len(CHECKED['metric'])} metric keys")
    if bad:
        print("\n".join(bad))
        print(f"FAIL: {len(bad)} stale name(s) in the docs: rename them to what the program has "
              "now, or drop them (a flag of another tool: see tests/lint/doc_names_other_tools.txt)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
