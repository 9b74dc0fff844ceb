#!/usr/bin/env bash
# Runs a GPU test only where a usable GPU is: asks the probe (tests/tools/gpu_probe.cpp, the same
# checks the in-test guards of tests/support/gpu.h and torch_gpu.h make) and exits 77, which
# ctest counts as skipped (SKIP_RETURN_CODE), when there is none; otherwise runs the command.
#   bash gpu_gate.sh PROBE MIN_GPUS CMD...
set -uo pipefail
probe="$1" min="$2"
shift 2
out="$("$probe" "$min" 2>&1)"; rc=$?
case $rc in
  0) echo "$out"; exec "$@" ;;
  1) echo "SKIP: no usable GPU: $out"; exit 77 ;;
  *) echo "$out"; echo "FAIL: $probe exited $rc"; exit 1 ;;
esac
