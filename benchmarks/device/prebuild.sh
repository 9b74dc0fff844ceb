#!/usr/bin/env bash
# Run HERE before a GPU call, after fetch_debs.sh: builds what the GPU plan runs (fsdp-train, the
# fsdp-train-core it execs, and the GPU test executables) with the carried Open MPI and libraries,
# against this machine's torch wheel (the same 2.11.0+cu130 build the GPU machine has), for sm_90,
# into build-gpu, and copies the executables to <repo>/.gpubin (ignored by git; about 9 MB).
# Carry [".deb", ".gpubin"]: run.sh uses them when they load there and builds there only when they
# do not. The first build here takes many minutes on 2 cores; later ones are incremental.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -d "$REPO/.deb" ] || { echo "prebuild.sh: run benchmarks/device/fetch_debs.sh first" >&2; exit 1; }
[ "$REPO" = /work/main ] || echo "prebuild.sh: warning: the executables name $REPO in their" \
  "library path; run.sh links /work/main to its copy, so build from /work/main" >&2
PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
D="$REPO/.deb/root"
rm -rf "$D"; mkdir -p "$D"
for f in "$REPO"/.deb/*.deb; do dpkg -x "$f" "$D"; done
export OPAL_PREFIX="$D/usr" OPAL_LIBDIR="$D/usr/lib/x86_64-linux-gnu/openmpi/lib" OPAL_SYSCONFDIR="$D/etc/openmpi"
export DEB_PREFIXES="$D/usr;$D/usr/lib/x86_64-linux-gnu/cmake;$D/usr/share/cmake;$D/usr/lib/cmake"
export DEB_CMAKE="-DMPI_CXX_COMPILER=$D/usr/bin/mpicxx.openmpi -DMPIEXEC_EXECUTABLE=$D/usr/bin/mpirun.openmpi -DCMAKE_CXX_FLAGS=-isystem$D/usr/include"
bash "$REPO/benchmarks/device/build.sh" "$PY" "$REPO/build-gpu"
B="$REPO/build-gpu"
rm -rf "$REPO/.gpubin"; mkdir -p "$REPO/.gpubin/tests"
cp "$B/fsdp-train" "$B/fsdp-train-core" "$REPO/.gpubin/"
cp "$B/tests/unit_model" "$B/tests/unit_shard" "$B/tests/mpi_comm" "$REPO/.gpubin/tests/"
# The GPU machine unpacks the packages again: the unpacked copy need not travel.
rm -rf "$D"
echo "prebuild.sh: executables in $REPO/.gpubin ($(du -sh "$REPO/.gpubin" | cut -f1)) at $(git -C "$REPO" rev-parse --short HEAD)"
