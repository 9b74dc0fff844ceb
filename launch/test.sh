#!/usr/bin/env bash
# Runs setup (install + build) and then the whole test suite through ctest.
#   bash launch/test.sh            every tier that can run here (GPU tests report skipped)
#   bash launch/test.sh -L unit    one tier: unit, mpi, e2e, fuzz, serving, cuda, lint
# The serving engine's install (launch/setup-serving.sh: network and disk) runs while the build
# (CPU) does; ctest runs the tests in parallel (FSDP_TEST_JOBS, default: the number of cores),
# longest first, the serving tier alone.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FSDP_SETUP_DEPS_ONLY=1 bash "$REPO/launch/setup.sh"
FSDP_BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build}"
mkdir -p "$FSDP_BUILD_DIR"
serving_log="$FSDP_BUILD_DIR/setup-serving.log"
bash "$REPO/launch/setup-serving.sh" >"$serving_log" 2>&1 &
serving_pid=$!
if ! FSDP_SKIP_APT=1 bash "$REPO/launch/setup.sh"; then
  kill "$serving_pid" 2>/dev/null
  exit 1
fi
wait "$serving_pid" || { cat "$serving_log"; exit 1; }
cat "$serving_log"
cd "$FSDP_BUILD_DIR"
ctest --output-on-failure --timeout 900 -j "${FSDP_TEST_JOBS:-$(nproc)}" "$@"
