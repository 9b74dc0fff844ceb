#!/usr/bin/env bash
# fsdp-train against the DeepSpeed ZeRO-3 reference (benchmarks/reference/deepspeed_train.py):
# same initial weights and batches, fp32, 1 and 2 ranks, ploss_0..6 and acc_0..6 of 3 steps agree
# to 1e-5 relative (benchmarks/compare/parity_deepspeed.sh; measured: 1.3e-7 to 1.5e-7).
# DeepSpeed lives in a venv of its own (benchmarks/reference/setup_deepspeed.sh; ctest's fixture
# setup.deepspeed runs it before this test); without it (or DS_PYTHON) the test fails.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DSPY="${DS_PYTHON:-${DS_VENV:-$HOME/.cache/fsdp-train/deepspeed-venv}/bin/python}"
"$DSPY" -c 'import deepspeed' >/dev/null 2>&1 ||
  fail "package deepspeed does not import in $DSPY (bash benchmarks/reference/setup_deepspeed.sh installs it)"
W="$BUILD/e2e_work/deepspeed_parity"; rm -rf "$W"; mkdir -p "$W"
FSDP_PYTHON="$PY" DS_PYTHON="$DSPY" WORK="$W" RANKS="1 2" ZERO_STAGES=3 STEPS=3 RTOL=1e-5 \
  MPIRUN="$MPIEXEC --allow-run-as-root --oversubscribe --bind-to none" \
  bash "$SRC/benchmarks/compare/parity_deepspeed.sh" "$BIN" >"$W/parity.log" 2>&1; rc=$?
grep -E "^parity:|^==|overall" "$W/parity.log"
[ $rc -eq 0 ] || { cat "$W/parity.log"; fail "fsdp-train differs from DeepSpeed ZeRO-3 (parity_deepspeed.sh exit $rc)"; }
[ "$(grep -c "^parity: .*: PASS" "$W/parity.log")" -eq 2 ] || fail "expected 2 passing comparisons"
echo PASS
