#!/usr/bin/env bash
# Configures and builds what the GPU plan runs (fsdp-train and the GPU test executables: Release,
# the CUDA backend, sm_90) against the given Python's torch, into BUILD_DIR. Used by run.sh's
# setup stage on the GPU machine when no executables were carried, and by prebuild.sh here.
#   build.sh PYTHON BUILD_DIR     (DEB_PREFIXES / DEB_CMAKE: the carried Debian libraries)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$1" B="$2"
TP="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
# Warnings do not stop this one-shot build (another compiler may warn where Debian's GCC 12 does
# not); they stay in the log.
# shellcheck disable=SC2086
cmake -S "$REPO" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP;${DEB_PREFIXES:-}" \
  -DFSDP_PYTHON="$PY" -DFSDP_GPU=CUDA -DTORCH_CUDA_ARCH_LIST=9.0 -DFSDP_WERROR=OFF ${DEB_CMAKE:-}
ninja -C "$B" -j "$(nproc)" fsdp-train mpi_comm unit_model unit_shard
