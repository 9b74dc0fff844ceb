#!/usr/bin/env bash
# Run HERE (Debian 12, with apt) before a GPU session: downloads the Debian packages the GPU
# machine lacks (Open MPI, yaml-cpp, CLI11, nlohmann-json, Catch2) as .deb files into
# <repo>/.deb (ignored by git). run.sh unpacks them there with dpkg -x when the machine has no
# MPI of its own. Pass `.deb` in the device tool's `carry` (at most 64 MiB travel in all).
#
# The list is explicit, not `apt-cache depends --recurse`: that walk follows libopenmpi-dev's
# gfortran alternative into flang/LLVM/MLIR (106 packages, 296 MB). These are the libraries the
# Open MPI, PMIx and yaml-cpp binaries need (readelf NEEDED) beyond what any glibc/zlib/udev
# system has, plus the header-only and static packages the build uses.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$REPO/.deb"
rm -rf "$DEST"
mkdir -p "$DEST"
grep -qx '/.deb/' "$REPO/.git/info/exclude" 2>/dev/null || echo '/.deb/' >>"$REPO/.git/info/exclude"
PKGS=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libmunge2 libhwloc15
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev
  nlohmann-json3-dev catch2 zlib1g-dev)
echo "downloading ${#PKGS[@]} packages into $DEST"
cd "$DEST"
apt-get download "${PKGS[@]}" >/dev/null
ls -1 "$DEST"/*.deb | wc -l
size_mb=$(du -sm "$DEST" | cut -f1)
echo "$DEST: ${size_mb} MB"
if (( size_mb > 40 )); then
  echo "fetch_debs.sh: error: $DEST is ${size_mb} MB; the device tool carries at most 64 MiB with" \
       "the working tree: drop packages the GPU machine already has" >&2
  exit 1
fi
