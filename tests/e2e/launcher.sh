#!/usr/bin/env bash
# The launcher: --nproc-per-node relaunches under mpirun; bad flags exit 2 with a message.
set -uo pipefail
BUILD="$1"
BIN="$BUILD/fsdp-train"
fail() { echo "FAIL: $*"; exit 1; }
out="$("$BIN" --nproc-per-node 2 comm-bench --quick 2>&1)"; rc=$?
head -5 <<<"$out"
[ $rc -eq 0 ] || fail "comm-bench under --nproc-per-node 2 exited $rc"
grep -q "comm-bench: 2 ranks" <<<"$out" || fail "header does not report 2 ranks"
for op in all_gather "reduce_scatter\[block\]" "reduce_scatter\[allreduce\]" all_reduce broadcast; do
  grep -Eq "^$op +1M " <<<"$out" || fail "no 1M row for $op"
done
expect_usage() {  # expect_usage "pattern" args...
  local pat="$1"; shift
  local o; o="$("$BIN" "$@" 2>&1)"; local r=$?
  [ $r -eq 2 ] || fail "'$*' exited $r, expected 2 (output: $o)"
  grep -q -- "$pat" <<<"$o" || fail "'$*' message lacks '$pat': $o"
  grep -q -- "---> HINT:" <<<"$o" || fail "'$*' has no HINT line: $o"
}
expect_usage "unknown flag --bogus-flag" --bogus-flag
expect_usage "not expected: --bogus" export --checkpoint x --output y --bogus
expect_usage "is not an integer from 1 to 1024" --nproc-per-node abc comm-bench
expect_usage "needs a value" --nproc-per-node
# Ranks per node are capped (1024); 0 and absurd counts are usage errors with a hint.
expect_usage "--nproc-per-node: '0'" --nproc-per-node 0 comm-bench
expect_usage "--nproc-per-node: '99999'" --nproc-per-node 99999 --launch-dry-run comm-bench
expect_usage "--max-restarts: '100000'" --nproc-per-node 2 --max-restarts 100000 comm-bench
# CLI11's own parse errors come out in our format (message, then HINT).
expect_usage "--dist-timeout" --dist-timeout
expect_usage "--dist-timeout 999999999999 is above its maximum" --dist-timeout 999999999999
expect_usage "above the maximum 64G" comm-bench --max-bytes 1e30
expect_usage "needs --hostfile" --nproc-per-node 2 --nnodes 2 comm-bench
expect_usage "cannot read" --nproc-per-node 2 --hostfile /nonexistent/hosts comm-bench
expect_usage "not in" comm-bench --dtype int7
expect_usage "cannot read size" comm-bench --min-bytes 12Q
# The launch plan: root and oversubscription handled, flags passed through.
plan="$("$BIN" --nproc-per-node 64 --launch-dry-run comm-bench --quick 2>"$BUILD/launcher-warn.txt")"
# 64 ranks on a machine with fewer than 16 cores: started, with a warning naming the flag.
if [ "$(nproc)" -lt 16 ]; then
  [ "$(grep -c -- "warning: --nproc-per-node 64 " "$BUILD/launcher-warn.txt")" -ge 1 ] ||
    fail "no oversubscription warning for 64 ranks on $(nproc) cores: $(cat "$BUILD/launcher-warn.txt")"
fi
grep -q -- "--oversubscribe" <<<"$plan" || fail "no --oversubscribe for 64 ranks: $plan"
grep -q -- "-np 64" <<<"$plan" || fail "no -np 64: $plan"
grep -q -- "comm-bench --quick" <<<"$plan" || fail "flags not passed through: $plan"
if [ "$(id -u)" -eq 0 ]; then grep -q -- "--allow-run-as-root" <<<"$plan" || fail "root not handled"; fi
# Ranks on this node take at least 128 MiB each (LibTorch, MPI): more than its memory holds at
# that floor is refused up front (64 ranks above need 8 GiB).
if [ "$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)" -lt $((1024 * 128)) ]; then
  expect_usage "GiB on this node" --nproc-per-node 1024 --launch-dry-run comm-bench
fi
hf="$(mktemp)"; echo "localhost slots=4" >"$hf"
plan="$("$BIN" --nproc-per-node 2 --nnodes 2 --hostfile "$hf" --launch-dry-run comm-bench)"
grep -q -- "--hostfile $hf" <<<"$plan" || fail "hostfile not passed: $plan"
grep -q -- "-np 4" <<<"$plan" || fail "nnodes x nproc not applied: $plan"
# Ranks on other nodes get NCCL's, W&B's, MLflow's, Hugging Face's and our variables and the thread count
# by name only.
plan="$(NCCL_IB_HCA=mlx5 WANDB_API_KEY=secret-value MLFLOW_TRACKING_TOKEN=secret-token OMP_NUM_THREADS=3 FSDP_PROGRESS=lines \
  HF_HOME=/models/hf "$BIN" --nproc-per-node 2 --nnodes 2 --hostfile "$hf" --launch-dry-run comm-bench)"
for v in NCCL_IB_HCA WANDB_API_KEY MLFLOW_TRACKING_TOKEN OMP_NUM_THREADS FSDP_PROGRESS HF_HOME; do
  grep -q -- "-x $v " <<<"$plan" || fail "$v not passed to the ranks: $plan"
done
grep -q "secret-value\|secret-token" <<<"$plan" && fail "a variable's value on the mpirun command line: $plan"
# A stop signal at any moment of the launcher's start-up is handled: never the default action
# (143/130), always the clean stop (exit 0: the ranks save and exit 0, or nothing was started
# yet), and no process of the job is left (the tag travels to mpirun and, as an FSDP_ variable,
# to every rank).
tagged() { grep -las "FSDP_TEST_TAG=$1" /proc/[0-9]*/environ | wc -l; }
# The first moment a program can take a signal: it is our executable and has blocked the signal,
# or a handler catches it (before that the process is still the shell's child, which blocks
# SIGTERM around its fork too, or the kernel is finishing execve).
protected() {
  local st; st="$(cat "/proc/$1/status" 2>/dev/null)" || return 0  # already gone: nothing to wait
  [ "$(readlink "/proc/$1/exe")" = "$(readlink -f "$BIN")" ] || return 1
  local blk cgt
  blk="$(awk '/^SigBlk:/ {print $2}' <<<"$st")"; cgt="$(awk '/^SigCgt:/ {print $2}' <<<"$st")"
  (( ((0x$blk | 0x$cgt) >> 14) & 1 ))  # bit 14: SIGTERM (15); the four are blocked together
}
stop_during_start() {  # stop_during_start SIGNAL DELAY_SECONDS
  local tag="launcher-$$-$1-$2" log="$BUILD/launcher-stop.log" pid r
  FSDP_TEST_TAG="$tag" "$BIN" --nproc-per-node 2 comm-bench --quick >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 2000); do protected "$pid" && break; sleep 0.005; done
  [ "$2" = 0 ] || sleep "$2"  # chooses WHEN the signal comes, not a synchronisation
  kill -"$1" "$pid"
  wait "$pid"; r=$?
  [ $r -eq 0 ] || fail "SIG$1 ${2}s into the launcher's start: exit $r, expected 0: $(tail -5 "$log")"
  [ "$(tagged "$tag")" -eq 0 ] || fail "SIG$1 ${2}s into the start left processes: $(tagged "$tag")"
}
t0=$SECONDS
for d in 0 0.01 0.03 0.1 0.25 0.5 0.75 1 1.25 1.5; do stop_during_start TERM "$d"; done
for d in 0 0.05 0.4 1.1; do stop_during_start INT "$d"; done
# A signal already pending when the program starts (blocked by the caller across the exec, the
# way the front passes signals to fsdp-train-core): handled once the launcher unblocks it.
o="$(python3 -c 'import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.kill(os.getpid(), signal.SIGTERM)
os.execv(sys.argv[1], sys.argv[1:])' "$BIN" --nproc-per-node 2 comm-bench --quick 2>&1)"; r=$?
[ $r -eq 0 ] && grep -q "before the job started" <<<"$o" || fail "pending SIGTERM at start: exit $r: $o"
echo "stop during start-up: 15 launches, every one exit 0, no process left ($((SECONDS - t0)) s)"
# A failing 2-rank job: each error line and its HINT line stay adjacent in the combined output
# (one write(2) per block), though two ranks and Open MPI's abort banner write at the same time.
adjacent_hints() {  # prints the offending line when an error line is not followed by its HINT
  awk '/^fsdp-train: error:/ {want = NR + 1; e = $0; n++}
       NR == want && !/^---> HINT:/ {print "no HINT after: " e; bad = 1}
       END {if (n == 0) print "no error line"; exit bad || n == 0}' <<<"$1"
}
o="$("$BIN" --nproc-per-node 2 comm-bench --min-bytes 12Q 2>&1)"; r=$?
[ $r -eq 2 ] || fail "2-rank flag error: exit $r, expected 2: $o"
adjacent_hints "$o" >/dev/null || fail "2-rank flag error: $(adjacent_hints "$o"): $o"
tmp="$(mktemp -d)"
o="$("$BIN" --nproc-per-node 2 --target-model-path "$tmp/none" --train-hidden-states-path \
  "$tmp/none" --output-dir "$tmp/out" 2>&1)"; r=$?
[ $r -eq 2 ] || fail "2-rank start-up error (MPI_Abort): exit $r, expected 2: $o"
adjacent_hints "$o" >/dev/null || fail "2-rank start-up error: $(adjacent_hints "$o"): $o"
rm -rf "$tmp"
grep -q "fsdp-train" <<<"$("$BIN" --version)" || fail "--version"
FSDP_LOG_LEVEL=bogus expect_usage "FSDP_LOG_LEVEL.*'bogus'" --version
# FSDP_ALLOCATOR (docs/troubleshooting.md "Host memory grows"): launch/setup.sh installs jemalloc,
# which the front preloads into the core by default, also into each rank under mpirun; system
# keeps the C library's malloc; a bad value exits 2.
v="$("$BIN" --version)"
[[ "$v" == *"allocator: jemalloc"* ]] || fail "default allocator is not jemalloc: $v"
v="$(FSDP_ALLOCATOR=system "$BIN" --version)"
[[ "$v" == *"allocator: glibc malloc"* ]] || fail "FSDP_ALLOCATOR=system: $v"
v="$("${FSDP_MPIEXEC:-mpiexec}" --allow-run-as-root --oversubscribe --bind-to none -n 2 "$BIN" --version 2>&1)"
[ "$(grep -c "allocator: jemalloc" <<<"$v")" -eq 2 ] || fail "ranks under mpirun: $v"
FSDP_ALLOCATOR=bogus expect_usage "FSDP_ALLOCATOR.*'bogus'" --version
echo PASS
