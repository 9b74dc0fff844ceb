#!/usr/bin/env bash
# Installs DeepSpeed (PyPI `deepspeed`, pinned) for benchmarks/reference/deepspeed_train.py, the
# second reference trainer. launch/setup.sh leaves it out; ctest's fixture setup.deepspeed runs this
# before e2e.deepspeed_parity (tests/CMakeLists.txt).
#
#   bash benchmarks/reference/setup_deepspeed.sh                 install (idempotent; ~1 s when done)
#   bash benchmarks/reference/setup_deepspeed.sh --wheelhouse D  also write the wheels to D (for a
#                                                               machine without internet, e.g. the
#                                                               GPU machine: carry D there)
#   bash benchmarks/reference/setup_deepspeed.sh --offline D     install from the wheels in D only
# Env: FSDP_PYTHON  the python whose torch DeepSpeed uses (default: the project venv,
#                   ~/.cache/fsdp-train/venv/bin/python; the GPU script passes /opt/torch/.venv's)
#      DS_VENV      where DeepSpeed goes (default ~/.cache/fsdp-train/deepspeed-venv)
# Prints the venv's python on its last line.
#
# Where it goes and why: a venv of its own that sees the project venv's packages (torch,
# safetensors, numpy, pydantic, ...) through a .pth file, with DeepSpeed and the few packages it
# adds (hjson, py-cpuinfo, einops, msgpack, ninja) installed only there. So DeepSpeed runs on
# exactly the torch that fsdp-train links and the FSDP2 reference uses, without a second copy of
# torch (GBs), and the project venv stays as launch/requirements.txt makes it: transformers and
# accelerate (the real-data feature builder) change behaviour when they can import deepspeed,
# and CI must not see it.
set -euo pipefail
DS_VERSION=0.19.8
# DeepSpeed's own requirements that the project venv lacks, pinned to the versions tested here.
EXTRA_PINS=(hjson==3.1.0 py-cpuinfo==9.0.0 einops==0.8.2 msgpack==1.2.4 ninja==1.13.2)
# Requirements of DeepSpeed that the project venv has (launch/requirements.txt pulls them in);
# pinned to its versions for the wheelhouse of a machine whose torch venv may lack them.
BASE_PINS=(packaging==26.4 psutil==7.2.2 pydantic==2.14.4 tqdm==4.70.1)
# Only to build DeepSpeed's wheel from its source distribution (the venv's own setuptools is
# too old to build wheels; torch 2.11 asks for setuptools < 82).
BUILD_PINS=(setuptools==80.9.0 wheel==0.48.0)
BASE_PY="${FSDP_PYTHON:-$HOME/.cache/fsdp-train/venv/bin/python}"
DS_VENV="${DS_VENV:-$HOME/.cache/fsdp-train/deepspeed-venv}"
MODE=online WHEELS=""
case "${1:-}" in
  "") ;;
  --wheelhouse) MODE=wheelhouse WHEELS="${2:?--wheelhouse needs a directory}" ;;
  --offline) MODE=offline WHEELS="${2:?--offline needs a directory}" ;;
  *) echo "usage: $0 [--wheelhouse DIR | --offline DIR]" >&2; exit 2 ;;
esac
say() { echo "[setup_deepspeed] $*" >&2; }
die() { echo "[setup_deepspeed] error: $*" >&2; exit 1; }
[[ -x "$BASE_PY" ]] || die "python $BASE_PY not found (run launch/setup.sh, or set FSDP_PYTHON)"
"$BASE_PY" -c 'import torch' 2>/dev/null || die "$BASE_PY cannot import torch"
DS_PY="$DS_VENV/bin/python"

installed() {  # the pinned version imports, on top of this base python's torch
  [[ -x "$DS_PY" ]] && "$DS_PY" - "$DS_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version("deepspeed") == sys.argv[1] else 1)
EOF
}

# The venv, linked to the base python's site-packages (recreated if that changed).
BASE_SITE="$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PTH_NAME=fsdp-train-base.pth
if [[ -x "$DS_PY" ]]; then
  DS_SITE="$("$DS_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  [[ "$(cat "$DS_SITE/$PTH_NAME" 2>/dev/null)" == "$BASE_SITE" ]] || {
    say "$DS_VENV was made for another base python: recreating it"; rm -rf "$DS_VENV"; }
fi
if [[ ! -x "$DS_PY" ]]; then
  say "creating $DS_VENV on top of $BASE_PY"
  # The base python may itself be a venv: `-m venv` builds on its interpreter, and the .pth
  # below brings in its packages (a venv's own site-packages comes first on sys.path).
  "$BASE_PY" -m venv "$DS_VENV" || die "python -m venv $DS_VENV failed"
  DS_SITE="$("$DS_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$BASE_SITE" >"$DS_SITE/$PTH_NAME"
fi

if [[ "$MODE" != wheelhouse ]] && installed; then
  say "deepspeed $DS_VERSION present in $DS_VENV"
  echo "$DS_PY"
  exit 0
fi

# DeepSpeed ships only a source distribution; with DS_BUILD_OPS=0 (the default) it builds no
# C++/CUDA ops at install time (we use none: torch's AdamW is the client optimizer) and its wheel
# is pure Python. --no-build-isolation: its setup.py imports torch, which must be this one.
export DS_BUILD_OPS=0
PIP=("$DS_PY" -m pip install -q --disable-pip-version-check)
case "$MODE" in
  online)
    say "installing deepspeed==$DS_VERSION and ${EXTRA_PINS[*]} into $DS_VENV"
    "${PIP[@]}" "${EXTRA_PINS[@]}" "${BUILD_PINS[@]}" ||
      die "pip install ${EXTRA_PINS[*]} ${BUILD_PINS[*]} failed (PyPI reachable?)"
    "${PIP[@]}" --no-build-isolation "deepspeed==$DS_VERSION" ||
      die "pip install deepspeed==$DS_VERSION failed (PyPI reachable?)"
    ;;
  wheelhouse)
    # Wheels for a machine without internet whose python version is not known here (the GPU
    # machine's torch venv): DeepSpeed's pure-Python wheel and every requirement of it except
    # torch and numpy (large, per python version; a torch venv normally has numpy, and the
    # offline install says so when it does not), binary ones for CPython 3.10-3.13.
    mkdir -p "$WHEELS"
    say "writing wheels to $WHEELS"
    "${PIP[@]}" "${BUILD_PINS[@]}" || die "pip install ${BUILD_PINS[*]} failed (PyPI reachable?)"
    "$DS_PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
      -w "$WHEELS" "deepspeed==$DS_VERSION" || die "building the deepspeed wheel failed"
    for v in 3.10 3.11 3.12 3.13; do
      "$DS_PY" -m pip download -q --disable-pip-version-check -d "$WHEELS" --only-binary=:all: \
        --python-version "$v" --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        "${EXTRA_PINS[@]}" "${BASE_PINS[@]}" || die "downloading wheels for python $v failed"
    done
    say "wheelhouse: $(ls "$WHEELS" | wc -l) files, $(du -sh "$WHEELS" | cut -f1)"
    installed || "$0"   # and install here too, from PyPI
    ;;
  offline)
    [[ -d "$WHEELS" ]] || die "no wheel directory $WHEELS"
    say "installing deepspeed==$DS_VERSION from $WHEELS (no index)"
    "${PIP[@]}" --no-index --find-links "$WHEELS" "deepspeed==$DS_VERSION" ||
      die "offline install failed: $WHEELS lacks a requirement of deepspeed that $BASE_PY does not have (pip says which above)"
    ;;
esac
installed || die "deepspeed $DS_VERSION does not import from $DS_VENV after the install"
say "deepspeed $DS_VERSION installed in $DS_VENV"
echo "$DS_PY"
