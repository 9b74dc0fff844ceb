# Shared helpers for the e2e training scripts: toy data (generated once per build directory),
# the mpirun wrapper, and numeric comparisons of exported checkpoints through the venv's Python.
BUILD="$1"
SRC="$2"
BIN="$BUILD/fsdp-train"
PY="${FSDP_PYTHON:-python3}"
MPIEXEC="${FSDP_MPIEXEC:-mpiexec}"
export OMP_NUM_THREADS=1
unset SGLANG_TORCH_PROFILER_DIR   # --profile traces go to <output-dir>/profile unless a test says

fail() { echo "FAIL: $*"; exit 1; }

# expect_usage_error LABEL CMD...: runs CMD (stdout and stderr together) and fails the test
# unless it exits with 2 (bad flags, configuration or input) and prints a "---> HINT:" line, as
# every such error must. The output is left in $out for the caller's own checks (not printed:
# the helper runs in the script's shell, so a failure here ends the script).
expect_usage_error() {
  local label="$1" rc
  shift
  out="$("$@" 2>&1)"; rc=$?
  [ $rc -eq 2 ] || { tail -8 <<<"$out"; fail "$label: exit $rc, expected 2"; }
  [ "$(grep -c -- "---> HINT:" <<<"$out")" -ge 1 ] || { tail -8 <<<"$out"; fail "$label: exit 2 without a ---> HINT line"; }
}

# toy_data NAME ARGS...: generates toy data into $BUILD/e2e_data/NAME once; the last
# rows_* folder of samples is held out as $dir/eval_hidden_states.
# Tests run in parallel (launch/test.sh: ctest -j): the first caller of a NAME generates it under
# a lock on that name, the others wait for it.
toy_data() {
  local name="$1"; shift
  local dir="$BUILD/e2e_data/$name" lock
  mkdir -p "$BUILD/e2e_data"
  exec {lock}>"$BUILD/e2e_data/.$name.lock"
  flock "$lock"
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    "$BIN" gen-toy-data --out "$dir" "$@" >/dev/null || fail "gen-toy-data $*"
    mkdir -p "$dir/eval_hidden_states"
    mv "$(ls -d "$dir"/hidden_states/rows_* | sort -V | tail -n 1)" "$dir/eval_hidden_states/"
    touch "$dir/.complete"
  fi
  exec {lock}>&-
  echo "$dir"
}

# run_np N ARGS...: the binary under mpiexec with N ranks (N=1 runs it directly).
run_np() {
  local np="$1"; shift
  if [ "$np" -eq 1 ]; then
    "$BIN" "$@"
  else
    "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n "$np" "$BIN" "$@"
  fi
}

# guarded SECONDS CMD...: runs CMD; if it is still running after SECONDS (a hang: the callers
# give several times the run's usual length), prints every thread's stack of CMD and its child
# processes (gdb, when installed) and kills them, returning 124: a hang fails in bounded time and
# says where it stood instead of running into the test's timeout. A watchdog poll, not a wait
# for an event: CMD's own exit ends it at once.
guarded() {
  local limit="$1" waited=0 pid p; shift
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge "$limit" ]; then
      echo "HANG: still running after ${limit}s: $*"
      for p in "$pid" $(pgrep -P "$pid"); do
        echo "--- stacks of pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
        command -v gdb >/dev/null &&
          timeout 60 gdb -p "$p" -batch -ex "thread apply all bt 25" 2>/dev/null | grep -E "^(Thread|#)"
      done
      pkill -9 -P "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 2
    waited=$((waited + 2))
  done
  wait "$pid"
}

# train_args DATA OUT: the common flags of a small deterministic run.
train_args() {
  local data="$1" out="$2"
  echo "--target-model-path $data/target --draft-model-config $data/draft_config.json" \
       "--train-hidden-states-path $data/hidden_states --cache-dir $data/cache" \
       "--output-dir $out --max-length 64 --ttt-length 3 --learning-rate 1e-3" \
       "--warmup-ratio 0.1 --log-steps 1 --device cpu --threads 1"
}

# wait_for_lines OUT LINES: waits (up to 60 s) until OUT/metrics.jsonl has LINES records.
wait_for_lines() {
  for _ in $(seq 1 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l <"$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.1
  done
}

# signal_after_lines PID OUT LINES SIGNAL: wait_for_lines OUT LINES, then sends SIGNAL to PID (a
# run started in the background) and returns PID's exit code.
signal_after_lines() {
  wait_for_lines "$2" "$3"
  kill -"$4" "$1"
  wait "$1"
}

# latest_ckpt DIR: the checkpoint with the highest step (numerically: step_12 after step_9; the
# directory path itself may contain underscores).
latest_ckpt() {
  local d
  for d in "$1"/epoch_*_step_*; do
    [ -d "$d" ] && echo "${d##*_step_} $d"
  done | sort -n -k1,1 | tail -n 1 | cut -d' ' -f2-
}

# check_engine_walk W CKPT MAX: evaluates the block-draft export CKPT (--eval-only on W/data's
# target and evaluation features) with every candidate anchor sampled (--num-anchors 64, above
# the toy samples' 32 positions; output in W/eval64) and with 8 (W/eval8). With all of them the
# engine's walk reaches only sampled anchors: every row is walked and eval/accept_len lies in
# [1, MAX] (1 + the proposals of a block). With 8 it meets unsampled anchors: no accept_len, and
# the rows left out are counted in eval/rows_not_walked.
check_engine_walk() {
  local w="$1" ckpt="$2" max="$3" n
  for n in 64 8; do
    run_np 1 --init-checkpoint "$ckpt" --eval-only --target-model-path "$w/data/target" \
      --draft-model-config "$ckpt/config.json" --eval-hidden-states-path "$w/data/eval_hidden_states" \
      --max-length 64 --device cpu --threads 1 --mixed-precision fp32 \
      --draft-global-batch-size 2 --draft-micro-batch-size 2 --num-anchors $n \
      --output-dir "$w/eval$n" >"$w/eval$n.log" 2>&1 ||
      { tail -30 "$w/eval$n.log"; fail "eval-only with $n anchors"; }
  done
  "$PY" - "$w/eval64/metrics.jsonl" "$w/eval8/metrics.jsonl" "$max" <<'PYEOF' || fail "the engine's walk in evaluation"
import json, sys
full, part = ([r for r in map(json.loads, open(p)) if "eval/acc" in r][-1] for p in sys.argv[1:3])
assert 1.0 <= full["eval/accept_len"] <= float(sys.argv[3]), full
assert full["eval/rows_not_walked"] == 0, full
assert "eval/accept_len" not in part and part["eval/rows_not_walked"] > 0, part
print(f"eval accept_len {full['eval/accept_len']:.3f}; {part['eval/rows_not_walked']:.0f} rows not "
      "walked with 8 anchors")
PYEOF
}

# compare_exports A B RTOL: every tensor of A/model.safetensors equals B's: RTOL 0 means
# bitwise; otherwise the relative L2 difference ||a-b||/||b|| must be <= RTOL, and at most one
# element in 4096 (at least one per tensor) may differ by more than 10*RTOL of the tensor's
# largest value. (Adam divides by sqrt(v): an element whose gradient is ~0 can take the other
# sign from an fp32 summation-order difference and move by ~lr, whatever the precision of the
# rest; measured: 1 of 8192 elements, by 1.0e-5 to 1.3e-5 of the largest value on an AVX-512
# machine, 5e-6 on another. The relative L2 is the precision check.)
compare_exports() {
  "$PY" - "$1/model.safetensors" "$2/model.safetensors" "$3" <<'PYEOF'
import sys
from safetensors.torch import load_file
a, b, rtol = load_file(sys.argv[1]), load_file(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys(), (sorted(a.keys()), sorted(b.keys()))
worst_l2 = worst_max = 0.0
flips = 0
for k in sorted(a):
    x, y = a[k], b[k]
    assert x.dtype == y.dtype and x.shape == y.shape, k
    if rtol == 0:
        if not (x == y).all():
            print("differs bitwise:", k); sys.exit(1)
        continue
    x, y = x.double(), y.double()
    l2 = ((x - y).norm() / y.norm().clamp_min(1e-30)).item()
    rel = (x - y).abs() / y.abs().max().clamp_min(1e-30)
    mx, far = rel.max().item(), int((rel > 10 * rtol).sum())
    worst_l2, worst_max, flips = max(worst_l2, l2), max(worst_max, mx), flips + far
    if l2 > rtol or far > max(1, x.numel() // 4096):
        print(f"{k}: relative L2 difference {l2:.3g}, max {mx:.3g}, {far} of {x.numel()} elements "
              f"beyond {10 * rtol:g} (tolerance {rtol})"); sys.exit(1)
print(f"exports agree (worst relative L2 {worst_l2:.3g}, worst max {worst_max:.3g}, "
      f"{flips} elements beyond {10 * rtol:g}, tolerance {rtol})")
PYEOF
}
