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
hf="$(mktemp)"; echo "localhost slots=4" >"$hf"
plan="$("$BIN" --nproc-per-node 2 --nnodes 2 --hostfile "$hf" --launch-dry-run comm-bench)"
grep -q -- "--hostfile $hf" <<<"$plan" || fail "hostfile not passed: $plan"
grep -q -- "-np 4" <<<"$plan" || fail "nnodes x nproc not applied: $plan"
# Ranks on other nodes get NCCL's, W&B's, Hugging Face's and our variables and the thread count
# by name only.
plan="$(NCCL_IB_HCA=mlx5 WANDB_API_KEY=secret-value OMP_NUM_THREADS=3 FSDP_PROGRESS=lines \
  HF_HOME=/models/hf "$BIN" --nproc-per-node 2 --nnodes 2 --hostfile "$hf" --launch-dry-run comm-bench)"
for v in NCCL_IB_HCA WANDB_API_KEY OMP_NUM_THREADS FSDP_PROGRESS HF_HOME; do
  grep -q -- "-x $v " <<<"$plan" || fail "$v not passed to the ranks: $plan"
done
grep -q "secret-value" <<<"$plan" && fail "a variable's value on the mpirun command line: $plan"
grep -q "fsdp-train" <<<"$("$BIN" --version)" || fail "--version"
o="$(FSDP_LOG_LEVEL=bogus "$BIN" --version 2>&1)"; r=$?
[ $r -eq 2 ] && grep -qE "FSDP_LOG_LEVEL.*'bogus'" <<<"$o" || fail "bad FSDP_LOG_LEVEL: exit $r: $o"
echo PASS
