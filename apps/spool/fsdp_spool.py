#!/usr/bin/env python3
"""The producer's side of fsdp-train's streaming spool (docs/data.md "Streaming").

A producer hands each finished sample to publish(): it waits until the spool's disk budget has
room for the sample, reserves that room (a temporary file of the sample's size, allocated under
the spool's lock, so producers on several hosts never overshoot the budget together), writes and
fsyncs the bytes, and renames the file to its final name, the moment the trainer may see it.
end_stream() writes END_OF_STREAM once every producer is done.

As a program:
  fsdp_spool.py status SPOOL                      the trainer's room.json and the spool's usage
  fsdp_spool.py end SPOOL                         write END_OF_STREAM
  fsdp_spool.py watch SPOOL --out FILE [--every S] [--until F]
      the spool's peak size (used_bytes, every S seconds, default 0.002) until F exists
      (default SPOOL/.spool/done), written to FILE: what the benchmarks and tests measure
  fsdp_spool.py replay --source DIR --spool SPOOL [--order FILE] [--every S] [--prefix P]
                       [--end] [--truncate K ...] [--resume]
      publish the *.ckpt / *.ckpt.gz files of an offline dump (sorted by path, or in the order
      of FILE: a JSON list of indices into that sorted list) one at a time, every S seconds,
      as <prefix><sequence>_<name>; --truncate K publishes the K-th file cut in half (a producer
      that died mid-write, for tests); --resume skips what an earlier replay published (a
      restarted producer). Temporary files of this host's dead producers are removed first.
      Depends only on the standard library.
"""

import argparse
import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

END_OF_STREAM = "END_OF_STREAM"
_HOST = socket.gethostname().replace(".", "-")
CONTROL = ".spool"


class SpoolError(RuntimeError):
    pass


def is_sample_name(name):
    return (not name.startswith(".") and "/" not in name
            and (name.endswith(".ckpt") or name.endswith(".ckpt.gz")))


def used_bytes(spool):
    """Bytes of the regular files in the spool's tree, less its hidden directories such as
    .spool (samples and files being written): the measure the trainer's budget uses."""
    total = 0
    seen = set()  # inodes: a file renamed while the directory is read may be listed twice
    for root, dirs, files in os.walk(spool):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except FileNotFoundError:
                continue  # acknowledged and deleted while we looked
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def room(spool):
    """The trainer's room.json as a dict, or None before a trainer has opened the spool."""
    try:
        return json.loads((Path(spool) / CONTROL / "room.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@contextlib.contextmanager
def _locked(spool):
    """The spool's producer lock (an exclusive flock on SPOOL/.spool/lock)."""
    (Path(spool) / CONTROL).mkdir(exist_ok=True)
    lock = os.open(Path(spool) / CONTROL / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)


def _reserve(spool, tmp, size, poll, wait_for_trainer, timeout):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = room(spool)
        if info is None and not wait_for_trainer:
            info = {"budget_bytes": 0, "ended": False}
        if info is not None:
            if info.get("ended"):
                raise SpoolError(f"{spool}: the stream has ended ({END_OF_STREAM}); "
                                 "a sample published now would never be trained")
            budget = int(info.get("budget_bytes") or 0)
            if budget and size > budget:
                raise SpoolError(f"a sample of {size} bytes is larger than the spool's budget "
                                 f"({budget} bytes): raise --stream-max-gb")
            with _locked(spool):
                if not budget or used_bytes(spool) + size <= budget:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    if size:
                        os.posix_fallocate(fd, 0, size)  # counted from now on
                    return fd
        if deadline is not None and time.monotonic() > deadline:
            raise SpoolError(f"{spool}: no room for {size} bytes after {timeout} s")
        time.sleep(poll)


def publish(spool, name, data, poll=0.05, wait_for_trainer=True, timeout=None):
    """Publishes `data` (bytes of a .ckpt / .ckpt.gz sample) as spool/name, honouring the budget.
    Blocks while the spool is full (and, with wait_for_trainer, until a trainer has opened it).
    Returns the sample's path."""
    if not is_sample_name(name):
        raise SpoolError(f"{name!r}: a sample's name ends in .ckpt or .ckpt.gz and does not "
                         "start with '.'")
    final = Path(spool) / name
    if final.exists():
        raise SpoolError(f"{final} exists: give every sample a name of its own (several "
                         "producers: a prefix each)")
    tmp = Path(spool) / f".{name}.{_HOST}.{os.getpid()}.tmp"
    fd = _reserve(spool, tmp, len(data), poll, wait_for_trainer, timeout)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], done)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    # Renamed under the lock too: a producer adding up the spool under the lock never reads the
    # directory while an entry moves (a listing may miss or repeat a file renamed meanwhile).
    with _locked(spool):
        os.rename(tmp, final)
    dfd = os.open(spool, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return final


def clean_stale(spool):
    """Removes the temporary files of this host's producers that died mid-write (their room is
    reserved until then). Returns the names removed."""
    removed = []
    with os.scandir(spool) as it:
        for e in it:
            parts = e.name.split(".")
            # .<name>.<host>.<pid>.tmp
            if not (e.name.startswith(".") and e.name.endswith(".tmp") and len(parts) >= 5):
                continue
            host, pid = parts[-3], parts[-2]
            if host != _HOST or not pid.isdigit():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            Path(e.path).unlink(missing_ok=True)
            removed.append(e.name)
    return removed


def published_names(spool):
    """Sample names the trainer's ledger records (acknowledged ones too) or the spool holds."""
    names = {e.name for e in os.scandir(spool) if is_sample_name(e.name)}
    try:
        for line in (Path(spool) / CONTROL / "ledger").read_text().splitlines():
            if line.startswith("A "):
                names.add(line.split(" ")[1])
    except FileNotFoundError:
        pass
    return names


def end_stream(spool):
    """Marks the end of the stream: the trainer drains the spool and finishes."""
    path = Path(spool) / END_OF_STREAM
    with open(path, "w") as f:
        f.write(f"{time.time()}\n")
        f.flush()
        os.fsync(f.fileno())


def _sources(src):
    # Byte-wise by full path: the order fsdp-train gives an offline .ckpt tree's samples.
    files = sorted((p for p in Path(src).rglob("*") if p.is_file() and is_sample_name(p.name)),
                   key=str)
    if not files:
        raise SpoolError(f"{src}: no *.ckpt / *.ckpt.gz files")
    return files


def cmd_watch(a):
    """The spool's largest size (used_bytes), sampled every a.every seconds until the file
    a.until exists (default SPOOL/.spool/done); written to a.out."""
    until = a.until or os.path.join(a.spool, CONTROL, "done")
    peak = 0
    while not os.path.exists(until):
        peak = max(peak, used_bytes(a.spool))
        time.sleep(a.every)
    Path(a.out).write_text(f"{peak}\n")


def cmd_replay(a):
    files = _sources(a.source)
    order = json.loads(Path(a.order).read_text()) if a.order else list(range(len(files)))
    truncate = set(a.truncate or [])
    stale = clean_stale(a.spool)
    if stale:
        print(f"removed {len(stale)} temporary file(s) of dead producers: {stale}", file=sys.stderr)
    done = published_names(a.spool) if a.resume else set()
    start = time.monotonic()
    published = 0
    for k, idx in enumerate(order):
        f = files[idx]
        name = f"{a.prefix}{k:08d}_{f.name}"
        if name in done:
            continue
        data = f.read_bytes()
        if k in truncate:
            data = data[: len(data) // 2]
        if a.every > 0:  # paced: the k-th file is due k * every seconds after the start
            delay = start + k * a.every - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        publish(a.spool, name, data)
        published += 1
    if a.end:
        end_stream(a.spool)
    print(json.dumps({"published": published, "skipped_as_published": len(order) - published,
                      "seconds": round(time.monotonic() - start, 2)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("status")
    p.add_argument("spool")
    p = sub.add_parser("end")
    p.add_argument("spool")
    p = sub.add_parser("watch")
    p.add_argument("spool")
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=float, default=0.002)
    p.add_argument("--until", default=None)
    p = sub.add_parser("replay")
    p.add_argument("--source", required=True)
    p.add_argument("--spool", required=True)
    p.add_argument("--order", default=None)
    p.add_argument("--every", type=float, default=0.0)
    p.add_argument("--prefix", default="")
    p.add_argument("--end", action="store_true")
    p.add_argument("--truncate", type=int, action="append")
    p.add_argument("--resume", action="store_true",
                   help="skip the files this replay already published (a restarted producer)")
    a = ap.parse_args()
    try:
        if a.cmd == "status":
            info = room(a.spool) or {}
            info["measured_used_bytes"] = used_bytes(a.spool)
            print(json.dumps(info))
        elif a.cmd == "end":
            end_stream(a.spool)
        elif a.cmd == "watch":
            cmd_watch(a)
        else:
            cmd_replay(a)
    except SpoolError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
