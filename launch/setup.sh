#!/usr/bin/env bash
# Installs everything fsdp-train needs on Debian 12 and builds it. Idempotent: reruns reuse the
# Debian packages, the venv and the build directory. Run as root (or with sudo available).
#   bash launch/setup.sh [TARGET ...]   build only these Ninja targets (default: all, the tests too)
#   FSDP_VENV       Python venv holding torch (LibTorch); default ~/.cache/fsdp-train/venv
#   FSDP_BUILD_DIR  build directory; default <repo>/build
#   FSDP_CMAKE_ARGS extra CMake arguments, e.g. "-DFSDP_SANITIZE=address,undefined"
#   FSDP_SKIP_APT=1 do not touch Debian packages (you installed them yourself)
#   FSDP_SETUP_DEPS_ONLY=1  stop after the packages and the venv (launch/test.sh then installs the
#                   serving engine while the build runs)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FSDP_VENV="${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}"
FSDP_BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build}"
export FSDP_VENV

say() { echo "[setup +${SECONDS}s] $*"; }
fail() {
  echo "[setup] FAILED: $1" >&2
  echo "[setup] what to do: $2" >&2
  exit 1
}

# 1. Debian packages.
APT_PACKAGES=(build-essential cmake ninja-build ccache git pkg-config python3 python3-venv
  libopenmpi-dev openmpi-bin libcli11-dev nlohmann-json3-dev libyaml-cpp-dev catch2 zlib1g-dev
  clang libclang-rt-14-dev clang-format time libjemalloc2)
if [ "${FSDP_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq || fail "apt-get update" "check network access to the Debian mirror"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null ||
      fail "apt-get install ${missing[*]}" "run the command by hand to see the error; free disk space or fix the mirror"
  else
    say "Debian packages present"
  fi
fi

# 2. Python venv outside the checkout with torch (LibTorch) and the test/benchmark packages.
PYTHON_BIN="${FSDP_PYTHON_BIN:-python3}"
if [ ! -x "$FSDP_VENV/bin/python" ]; then
  say "creating venv $FSDP_VENV"
  mkdir -p "$(dirname "$FSDP_VENV")"
  "$PYTHON_BIN" -m venv "$FSDP_VENV" || fail "python3 -m venv $FSDP_VENV" "install python3-venv, or set FSDP_PYTHON_BIN to a Python >= 3.10"
fi
REQ="$REPO/launch/requirements.txt"
STAMP="$FSDP_VENV/.fsdp-requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  say "installing Python packages into $FSDP_VENV (torch is large: a few minutes the first time)"
  "$FSDP_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null ||
    fail "pip upgrade" "check network access to PyPI"
  "$FSDP_VENV/bin/python" -m pip install -q -r "$REQ" ||
    fail "pip install -r launch/requirements.txt" "check network access to PyPI and free disk space (~6 GB for torch and its CUDA libraries)"
  echo "$want" >"$STAMP"
else
  say "venv up to date: $FSDP_VENV"
fi
# SpecForge's own modeling code for the parity test (tests/e2e/specforge_modeling.sh): only its
# draft model module is imported, so its dependency pins (sglang, another transformers) are not
# installed.
if ! "$FSDP_VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("specforge") is None)'; then
  say "installing specforge 0.2.0 (modeling code for the parity test) without its dependencies"
  "$FSDP_VENV/bin/python" -m pip install -q --no-deps specforge==0.2.0 ||
    fail "pip install --no-deps specforge==0.2.0" "check network access to PyPI"
fi
TORCH_PREFIX="$("$FSDP_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" ||
  fail "import torch" "delete $FSDP_VENV and rerun launch/setup.sh"

[ "${FSDP_SETUP_DEPS_ONLY:-0}" = 1 ] && { say "dependencies ready (FSDP_SETUP_DEPS_ONLY: no build)"; exit 0; }

# 3. Configure and build (CMake + Ninja + ccache).
if [ ! -f "$FSDP_BUILD_DIR/build.ninja" ]; then
  say "configuring $FSDP_BUILD_DIR"
  # shellcheck disable=SC2086
  cmake -S "$REPO" -B "$FSDP_BUILD_DIR" -G Ninja -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DFSDP_PYTHON="$FSDP_VENV/bin/python" ${FSDP_CMAKE_ARGS:-} ||
    fail "cmake configure" "read the CMake error above; delete $FSDP_BUILD_DIR to start clean"
fi
# Targets from the command line (quickstart.sh asks for fsdp-train only); none means all.
targets=()
for t in "$@"; do targets+=(--target "$t"); done
say "building ${*:-all targets} (first build: several minutes on 2 cores; ccache makes rebuilds fast)"
build_start=$(date +%s)
cmake --build "$FSDP_BUILD_DIR" -j "$(nproc)" "${targets[@]}" ||
  fail "build" "read the compiler error above; delete $FSDP_BUILD_DIR and rerun if the build directory is stale"
say "ready: $FSDP_BUILD_DIR/fsdp-train (${*:-all targets}; build step: $(( $(date +%s) - build_start )) s)"
