#!/usr/bin/env bash
# Run HERE before a GPU session, after fetch_debs.sh: builds fsdp-train (the front and the
# fsdp-train-core it execs) and the three GPU test executables exactly as run.sh would on the
# GPU machine (Release, CUDA backend, sm_90, the carried Open MPI), against this machine's torch
# wheel, which is the same 2.11.0+cu130 build, and puts them in <repo>/.gpubin (ignored by git). Carry [".deb", ".gpubin"]: run.sh uses them when they
# load there, and builds there only when they do not. About 9 MB; the build here takes minutes
# (incremental in build-gpu afterwards).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -d "$REPO/.deb" ] || { echo "prebuild.sh: run benchmarks/device/fetch_debs.sh first" >&2; exit 1; }
[ "$REPO" = /work/main ] || echo "prebuild.sh: warning: the executables name $REPO in their" \
  "library path; run.sh links /work/main to its copy, so build from /work/main" >&2
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
OUT="${OUT:-$REPO/out/prebuild}" FSDP_DEVICE_FORCE_DEB=1 FSDP_DEVICE_BUILD_ONLY=1 \
  FSDP_DEVICE_BUILD_LIMIT="${FSDP_DEVICE_BUILD_LIMIT:-3000}" FSDP_PYTHON="$PY" \
  bash "$REPO/benchmarks/device/run.sh"
# run.sh unpacked the packages into .deb/root for this build (34 MB); the GPU machine unpacks
# them again, so they need not travel with the carried .deb folder.
rm -rf "$REPO/.deb/root"
