#!/usr/bin/env bash
# Runs setup (install + build) and then the whole test suite through ctest.
#   bash launch/test.sh            every tier that can run here (GPU tests skip themselves)
#   bash launch/test.sh -L unit    one tier: unit, mpi, e2e, fuzz, serving, cuda
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/launch/setup.sh"
bash "$REPO/launch/setup-serving.sh"
FSDP_BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build}"
cd "$FSDP_BUILD_DIR"
ctest --output-on-failure --timeout 900 "$@"
