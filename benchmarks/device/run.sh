#!/usr/bin/env bash
# THE script for the GPU machine (one H200; torch 2.11.0+cu130 in /opt/torch/.venv; CUDA 13.0;
# CMake + ninja; no internet, no apt). Call it through the device tool from the repo root with
# carry [".deb", ".gpubin", ".whl"] (made here by benchmarks/device/fetch_debs.sh, about 6 MB,
# benchmarks/device/prebuild.sh, about 9 MB, and benchmarks/reference/setup_deepspeed.sh
# --wheelhouse .whl/deepspeed, the DeepSpeed reference's wheels) and timeout_s 590:
#   bash benchmarks/device/run.sh
# It: 1) unpacks the carried Debian packages (the machine, seen 2026-11-30, has an Open MPI, CLI11
# and yaml-cpp 0.8 of its own but no Catch2, and the prebuilt executables need Debian's yaml-cpp
# 0.7), 2) uses the prebuilt executables when they load there, else builds fsdp-train against the
# machine's torch, 3) benchmarks the llama3-8B-eagle3 draft at sequence length 2048 on synthetic
# features for fsdp-train (twice: once profiled, once not) and for the PyTorch FSDP2 reference on
# the same GPU and prints tokens/s, MFU and peak memory for both and their ratio (and the same for
# DeepSpeed ZeRO-3 when its wheels were carried), 3b) measures --packing on chat lengths against
# unpacked, the reference and the fixed-length run, 3c) measures --fused-cuda-kernels, 4) measures --activation-checkpointing, 5) checks
# parity with the reference on the GPU in fp32, 6) runs the [cuda]/[nccl] tests, 7) measures
# --cpu-offload, 8) measures the longest samples one H200 trains (peak memory against
# `fsdp-train memory-plan`). The benchmarks come before the tests because they are what a session cannot get
# elsewhere; every stage has a time limit so one hang cannot spend the call, and a failed stage does
# not stop the later ones. $OUT gets 7 files (the device tool returns at most 8): device.log
# (everything printed), build.log (configure, build, feature generation), runs.log (every training
# run's output), metrics.tar.gz (the runs' metrics.jsonl), profile-summary.txt (the operators and
# CUDA kernels of two profiled fsdp-train steps), trace.json.gz (their timeline, for
# ui.perfetto.dev) and offload-profile-summary.txt (two profiled --cpu-offload steps).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$REPO/out/device}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device.log") 2>&1
M=/tmp/fsdp-device-metrics   # the metrics.jsonl files; bundled into $OUT/metrics.tar.gz
rm -rf "$M"; mkdir -p "$M"
bundle() { tar czf "$OUT/metrics.tar.gz" -C "$M" . 2>/dev/null; }
# FSDP_DEVICE_SKIP: stages to leave out of a rerun whose numbers are already in hand, any of
# "benchmark deepspeed packing fused checkpointing parity tests offload longctx" (benchmark: the
# fsdp-train and reference runs; deepspeed: the DeepSpeed ZeRO-3 run inside it; packing: the
# chat-length runs; longctx: one step at 16k, 32k and 64k tokens).
skip() { [[ " ${FSDP_DEVICE_SKIP:-} " == *" $1 "* ]]; }
SAMPLES="${FSDP_DEVICE_SAMPLES:-48}"   # > STEPS: no epoch boundary inside the measured windows
STEPS="${FSDP_DEVICE_STEPS:-40}"   # dry runs on a CPU machine: FSDP_DEVICE_SEQ=128
# FSDP_DEVICE_STEPS=2 FSDP_DEVICE_BUILD_LIMIT=900 FSDP_PYTHON=<venv python>
SEQ="${FSDP_DEVICE_SEQ:-2048}"
T0=$(date +%s)
stamp() { echo "[device +$(( $(date +%s) - T0 ))s] $*"; }
PY="${FSDP_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
stamp "host: $(hostname), $(nproc) cores, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
timeout 60 "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
NVCC="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)"
echo "nvcc: ${NVCC:-none} $( [ -n "$NVCC" ] && "$NVCC" --version | tail -1); g++: $(g++ --version | sed -n 1p)"

# 1. MPI and the other Debian dependencies.
DEBROOT="$REPO/.deb/root"
PREFIXES=""
EXTRA_CMAKE=()
# The carried packages whenever they are there (FSDP_DEVICE_FORCE_DEB=1 insists on them, for a
# dry run of this path on a development machine); the machine's own only without them.
if [ "${FSDP_DEVICE_FORCE_DEB:-0}" != 1 ] && [ ! -d "$REPO/.deb" ] && command -v mpicxx >/dev/null &&
   [ -f /usr/include/yaml-cpp/yaml.h ] && [ -f /usr/include/CLI/CLI.hpp ] &&
   [ -f /usr/include/catch2/catch.hpp ]; then
  stamp "using the machine's MPI and libraries"
else
  [ -d "$REPO/.deb" ] || { echo "no MPI here and no carried .deb folder: run benchmarks/device/fetch_debs.sh and carry .deb"; exit 1; }
  stamp "unpacking $(ls "$REPO"/.deb/*.deb | wc -l) carried Debian packages into $DEBROOT"
  rm -rf "$DEBROOT"; mkdir -p "$DEBROOT"
  for f in "$REPO"/.deb/*.deb; do dpkg -x "$f" "$DEBROOT"; done
  export PATH="$DEBROOT/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$DEBROOT/usr/lib/x86_64-linux-gnu:$DEBROOT/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
  export OPAL_PREFIX="$DEBROOT/usr"          # relocates Open MPI's wrappers and help files
  export OPAL_LIBDIR="$DEBROOT/usr/lib/x86_64-linux-gnu/openmpi/lib"
  # /etc/openmpi is absolute (OPAL_PREFIX does not move it): Debian's MCA defaults from there.
  export OPAL_SYSCONFDIR="$DEBROOT/etc/openmpi"
  export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1
  # Debian's mpicxx is a symlink chain through /etc/alternatives: point at the real wrapper.
  MPICXX="$DEBROOT/usr/bin/mpicxx.openmpi"
  PREFIXES="$DEBROOT/usr;$DEBROOT/usr/lib/x86_64-linux-gnu/cmake;$DEBROOT/usr/share/cmake;$DEBROOT/usr/lib/cmake"
  EXTRA_CMAKE=(-DMPI_CXX_COMPILER="$MPICXX" -DMPIEXEC_EXECUTABLE="$DEBROOT/usr/bin/mpirun.openmpi"
    -DCMAKE_CXX_FLAGS="-isystem $DEBROOT/usr/include")
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -n "$NVCC" ] && [ ! -d /usr/local/cuda ] && EXTRA_CMAKE+=(-DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")")

# 2. Executables built ahead on the development machine (benchmarks/device/prebuild.sh puts
# them in .gpubin; carry it too) against the same torch 2.11.0+cu130, nvcc 13.0 and sm_90: used
# when every library resolves and --version runs, which saves the build's minutes of device
# time. Their RUNPATH and the tests' source paths name /work/main: linked to this copy when
# absent. Otherwise, or when they fail, the build below.
TORCH_DIR="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
SITE="$(dirname "$TORCH_DIR")"
B=""
if [ "${FSDP_DEVICE_BUILD_ONLY:-0}" != 1 ] && [ -x "$REPO/.gpubin/fsdp-train" ] &&
  [ -x "$REPO/.gpubin/fsdp-train-core" ]; then
  [ -e /work/main ] || { mkdir -p /work && ln -s "$REPO" /work/main; }
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$TORCH_DIR/lib:$SITE/nvidia/nccl/lib:$SITE/nvidia/cu13/lib"
  if ldd "$REPO/.gpubin/fsdp-train-core" "$REPO"/.gpubin/tests/* | grep "not found"; then
    stamp "prebuilt executables: libraries missing (above); building here"
  elif "$REPO/.gpubin/fsdp-train" --version; then
    B="$REPO/.gpubin"
    stamp "using the prebuilt executables in $B"
  else
    stamp "prebuilt fsdp-train --version failed; building here"
  fi
fi
if [ -z "$B" ]; then
# Build against the machine's torch. Warnings do not stop this one-shot build (another
# compiler version may warn where Debian's GCC 12 does not); they stay in build.log.
TORCH_PREFIX="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
B="$REPO/build-gpu"
stamp "configure"
timeout 150 cmake -S "$REPO" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIXES" -DFSDP_PYTHON="$PY" -DFSDP_GPU=CUDA \
  -DTORCH_CUDA_ARCH_LIST=9.0 -DFSDP_WERROR=OFF "${EXTRA_CMAKE[@]}" >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
grep -E "^(NCCL_INCLUDE_DIR|NCCL_LIBRARY|CUDAToolkit_ROOT|MPI_CXX_COMPILER)[:=]" "$B/CMakeCache.txt"
grep "fsdp-train: Torch" "$OUT/build.log"
stamp "build"
timeout "${FSDP_DEVICE_BUILD_LIMIT:-360}" ninja -C "$B" -j "$(nproc)" fsdp-train mpi_comm unit_model unit_shard \
  >>"$OUT/build.log" 2>&1 || { grep -m 40 -E "error|FAILED" "$OUT/build.log"; exit 1; }
stamp "built"
fi
# FSDP_DEVICE_BUILD_ONLY=1 (benchmarks/device/prebuild.sh, on the development machine): keep the
# executables in .gpubin for the device call and stop.
if [ "${FSDP_DEVICE_BUILD_ONLY:-0}" = 1 ]; then
  rm -rf "$REPO/.gpubin"; mkdir -p "$REPO/.gpubin/tests"
  # fsdp-train is the front that execs fsdp-train-core from its own directory: both travel.
  cp "$B/fsdp-train" "$B/fsdp-train-core" "$REPO/.gpubin/" &&
    cp "$B/tests/unit_model" "$B/tests/unit_shard" "$B/tests/mpi_comm" "$REPO/.gpubin/tests/" ||
    exit 1
  stamp "executables in $REPO/.gpubin: $(du -sh "$REPO/.gpubin" | cut -f1)"
  exit 0
fi
ldd "$B/fsdp-train-core" | grep -E "not found|nccl|cudart|libmpi|libtorch_cuda"

# 3. Synthetic llama3-8B features at S=$SEQ (hidden 4096, vocab 128256, draft vocab 32000).
# A second call on the same (still warm) machine reuses them.
DATA="/tmp/fsdp-device-data-$SEQ-$SAMPLES"
DRAFT="$REPO/configs/models/llama3-8B-eagle3.json"
if [ -f "$DATA/toy_data.json" ]; then
  stamp "reusing the synthetic features in $DATA"
else
  stamp "generating synthetic features"
  rm -rf "$DATA"
  timeout 150 "$B/fsdp-train" gen-toy-data --out "$DATA" --num-samples "$SAMPLES" --min-len "$SEQ" \
    --max-len "$SEQ" --hidden-size 4096 --vocab-size 128256 --draft-vocab-size 32000 \
    --samples-per-dir 64 >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; rm -rf "$DATA"; exit 1; }
fi

# Same data, batches (micro-batch 1, global batch 1), schedule and step count for both.
# --save-final false: the benchmark needs no 7 GB checkpoint at the end.
# RUN_DATA / RUN_GB / RUN_LOG: another feature set / global batch / log interval (the packing
# stage).
fsdp_run() {  # $1 name, $2 time limit, then extra flags
  local name="$1" limit="$2" data="${RUN_DATA:-$DATA}"; shift 2
  rm -rf "/tmp/fsdp-device-$name"   # a fresh run and metrics file on every call
  timeout "$limit" "$B/fsdp-train" --target-model-path "$data/target" --draft-model-config "$DRAFT" \
    --train-hidden-states-path "$data/hidden_states" --cache-dir "$data/cache" \
    --output-dir "/tmp/fsdp-device-$name" --max-length "$SEQ" --draft-global-batch-size "${RUN_GB:-1}" \
    --draft-micro-batch-size 1 --num-epochs 4 --total-steps "$STEPS" --log-steps "${RUN_LOG:-10}" \
    --save-interval 0 --save-final false --report-to none --device cuda --mixed-precision bf16 \
    "$@" >"/tmp/fsdp-device-$name.log" 2>&1
  local rc=$?
  { echo "===== $name (exit code $rc)"; cat "/tmp/fsdp-device-$name.log"; } >>"$OUT/runs.log"
  cp "/tmp/fsdp-device-$name/metrics.jsonl" "$M/$name-metrics.jsonl" 2>/dev/null
  bundle
  [ $rc -eq 0 ] || { echo "$name: exit code $rc (124: time limit)"; tail -30 "/tmp/fsdp-device-$name.log"; }
  return $rc
}
skip benchmark || {
stamp "fsdp-train: $STEPS steps, bf16, 1 GPU"
# Steps 9-10 are profiled (operators and CUDA kernels): they lie in the first logged window,
# which compare.py leaves out as warm-up, so the measured windows are not slowed by it.
rm -rf /tmp/fsdp-device-profile
fsdp_run fsdp-train 120 --profile --profile-start-step 8 --profile-num-steps 2 \
  --profile-record-shapes true --profile-dir /tmp/fsdp-device-profile
if [ -f /tmp/fsdp-device-profile/rank0.summary.txt ]; then
  cp /tmp/fsdp-device-profile/rank0.summary.txt "$OUT/profile-summary.txt"
  gzip -c /tmp/fsdp-device-profile/rank0.trace.json >"$OUT/trace.json.gz" 2>/dev/null
  grep -A 14 "GPU kernels" /tmp/fsdp-device-profile/rank0.summary.txt | cut -c1-160
fi
# The same run again without the profiler: the spread between the two is the noise floor.
stamp "fsdp-train again (no profiler)"
fsdp_run fsdp-train-2 120

stamp "reference (PyTorch FSDP2): $STEPS steps, bf16, 1 GPU"
rm -rf /tmp/fsdp-device-ref
timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
  "$REPO/benchmarks/reference/train.py" --device cuda --target-model-path "$DATA/target" \
  --draft-model-config "$DRAFT" --train-hidden-states-path "$DATA/hidden_states" \
  --cache-dir "$DATA/cache-ref" --output-dir /tmp/fsdp-device-ref --max-length "$SEQ" \
  --draft-global-batch-size 1 --draft-micro-batch-size 1 --num-epochs 4 --total-steps "$STEPS" \
  --log-steps 10 --param-dtype bf16 --loader-workers 4 >/tmp/fsdp-device-reference.log 2>&1
rc=$?
{ echo "===== reference (exit code $rc)"; cat /tmp/fsdp-device-reference.log; } >>"$OUT/runs.log"
[ $rc -eq 0 ] || { echo "reference: exit code $rc (124: time limit)"; tail -30 /tmp/fsdp-device-reference.log; }
cp /tmp/fsdp-device-ref/metrics.jsonl "$M/reference-metrics.jsonl" 2>/dev/null
bundle

# The DeepSpeed reference (benchmarks/reference/deepspeed_train.py): the same step, data, batches
# and steps under DeepSpeed ZeRO-3, bf16 (fp32 master weights, reduction and accumulation). No
# internet here: it installs from the wheels that benchmarks/reference/setup_deepspeed.sh
# --wheelhouse .whl/deepspeed wrote on the development machine (carry ".whl" too), into a venv
# on top of this torch; without them, or when the install fails, the stage says so and is skipped.
skip deepspeed || {
DSPY=""
if [ -d "$REPO/.whl/deepspeed" ]; then
  DSPY="$(FSDP_PYTHON="$PY" DS_VENV=/tmp/fsdp-ds-venv timeout 90 \
    bash "$REPO/benchmarks/reference/setup_deepspeed.sh" --offline "$REPO/.whl/deepspeed" | tail -1)"
  [ -x "$DSPY" ] || { echo "deepspeed: offline install failed (above): stage skipped"; DSPY=""; }
else
  echo "deepspeed: no carried .whl/deepspeed (run benchmarks/reference/setup_deepspeed.sh" \
    "--wheelhouse .whl/deepspeed here first and carry .whl): stage skipped"
fi
if [ -n "$DSPY" ]; then
  stamp "DeepSpeed ZeRO-3: $STEPS steps, bf16, 1 GPU"
  rm -rf /tmp/fsdp-device-ds3
  timeout 150 "$DSPY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    "$REPO/benchmarks/reference/deepspeed_train.py" --zero-stage 3 --device cuda \
    --target-model-path "$DATA/target" --draft-model-config "$DRAFT" \
    --train-hidden-states-path "$DATA/hidden_states" --cache-dir "$DATA/cache-ref" \
    --output-dir /tmp/fsdp-device-ds3 --max-length "$SEQ" --draft-global-batch-size 1 \
    --draft-micro-batch-size 1 --num-epochs 4 --total-steps "$STEPS" --log-steps 10 \
    --param-dtype bf16 --loader-workers 4 >/tmp/fsdp-device-deepspeed.log 2>&1
  rc=$?
  { echo "===== deepspeed-z3 (exit code $rc)"; cat /tmp/fsdp-device-deepspeed.log; } >>"$OUT/runs.log"
  [ $rc -eq 0 ] || { echo "deepspeed: exit code $rc (124: time limit)"; tail -30 /tmp/fsdp-device-deepspeed.log; }
  cp /tmp/fsdp-device-ds3/metrics.jsonl "$M/deepspeed-z3-metrics.jsonl" 2>/dev/null
  bundle
fi
}

stamp "comparison"
for run in fsdp-train fsdp-train-2; do
  "$PY" "$REPO/benchmarks/device/compare.py" "$M/$run-metrics.jsonl" \
    "$M/reference-metrics.jsonl" "$DRAFT" "$SEQ"
done
[ -s "$M/deepspeed-z3-metrics.jsonl" ] &&
  "$PY" "$REPO/benchmarks/device/compare.py" "$M/fsdp-train-2-metrics.jsonl" \
    "$M/deepspeed-z3-metrics.jsonl" "$DRAFT" "$SEQ" deepspeed-z3
# Where a step's time goes on the GPU (docs/usage.md "Time breakdown": CUDA events, exposed
# NCCL waits), averaged over the logged windows after the first (warm-up).
"$PY" - "$M/fsdp-train-2-metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"perf/forward_share"' in l][1:]
if rows:
    phases = ["forward", "backward", "comm", "optimizer", "data", "other"]
    print("time breakdown per step (ms):", ", ".join(
        f"{p} {1e3 * sum(r.get(f'perf/{p}_s', 0) for r in rows) / len(rows):.1f}" for p in phases))
PYEOF
}

# 3b. Packing (docs/usage.md "Packing") on a realistic length distribution: the real chat
# features' lengths (benchmarks/device/chat_lengths.txt) scaled so the longest is $SEQ, SpecForge's
# global batch 16 at micro-batch 1: fsdp-train unpacked, packed (budget $SEQ), and the reference,
# against the fixed-length run above (goal: packed >= 90% of its tokens/s).
skip packing || {
LENGTHS=$(grep -v '^#' "$REPO/benchmarks/device/chat_lengths.txt" | "$PY" -c '
import sys; seq = int(sys.argv[1]); ls = [int(x) for x in sys.stdin.read().split(",")]
print(",".join(str(max(2, round(l * seq / max(ls)))) for l in ls))' "$SEQ")
DATAV="/tmp/fsdp-device-data-chat-$SEQ"
if [ ! -f "$DATAV/toy_data.json" ]; then
  stamp "generating synthetic features with the chat lengths"
  rm -rf "$DATAV"
  timeout 150 "$B/fsdp-train" gen-toy-data --out "$DATAV" --num-samples 96 --lengths "$LENGTHS" \
    --hidden-size 4096 --vocab-size 128256 --draft-vocab-size 32000 --samples-per-dir 48 \
    >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; rm -rf "$DATAV"; }
fi
if [ -f "$DATAV/toy_data.json" ]; then
  PSTEPS="${FSDP_DEVICE_PACKING_STEPS:-12}"
  stamp "chat lengths, global batch 16: fsdp-train unpacked, packed, reference ($PSTEPS steps each)"
  RUN_DATA="$DATAV" RUN_GB=16 RUN_LOG=2 STEPS="$PSTEPS" fsdp_run chat-unpacked 150
  RUN_DATA="$DATAV" RUN_GB=16 RUN_LOG=2 STEPS="$PSTEPS" fsdp_run chat-packed 150 --packing
  rm -rf /tmp/fsdp-device-chat-ref
  timeout 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    "$REPO/benchmarks/reference/train.py" --device cuda --target-model-path "$DATAV/target" \
    --draft-model-config "$DRAFT" --train-hidden-states-path "$DATAV/hidden_states" \
    --cache-dir "$DATAV/cache-ref" --output-dir /tmp/fsdp-device-chat-ref --max-length "$SEQ" \
    --draft-global-batch-size 16 --draft-micro-batch-size 1 --num-epochs 4 --total-steps "$PSTEPS" \
    --log-steps 2 --param-dtype bf16 --loader-workers 4 >/tmp/fsdp-device-chat-ref.log 2>&1
  { echo "===== chat reference (exit code $?)"; cat /tmp/fsdp-device-chat-ref.log; } >>"$OUT/runs.log"
  cp /tmp/fsdp-device-chat-ref/metrics.jsonl "$M/chat-reference-metrics.jsonl" 2>/dev/null
  bundle
  "$PY" - "$M" <<'PYEOF'
import json, os, sys
m = sys.argv[1]
def steady(name):  # tokens/s, MFU and the breakdown over the logged windows after the first
    path = os.path.join(m, name + "-metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "perf/tokens_per_s" in r or "perf/tokens" in r][1:]
    if not rows:
        return None
    secs = sum(r.get("perf/step_s", r.get("perf/step_time_s", 0)) for r in rows)
    tok = sum(r["perf/tokens"] if "perf/tokens" in r else
              r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in rows)
    out = {"tokens_per_s": tok / secs if secs else 0.0}
    if all("perf/mfu" in r for r in rows):
        out["mfu"] = sum(r["perf/mfu"] for r in rows) / len(rows)
    return out
fixed, un, pk, ref = (steady(n) for n in ("fsdp-train-2", "chat-unpacked", "chat-packed", "chat-reference"))
for name, r in (("fixed length", fixed), ("chat unpacked", un), ("chat packed", pk), ("chat reference", ref)):
    print(f"{name}: " + (f"{r['tokens_per_s']:.0f} tokens/s" + (f", MFU {r['mfu']:.3f}" if "mfu" in r else "") if r else "no steady-state numbers"))
if pk and fixed:
    print(f"packed / fixed-length tokens/s: {pk['tokens_per_s'] / fixed['tokens_per_s']:.3f} (goal >= 0.90)")
if pk and un:
    print(f"packed / unpacked: {pk['tokens_per_s'] / un['tokens_per_s']:.3f}")
if pk and ref:
    print(f"packed / reference: {pk['tokens_per_s'] / ref['tokens_per_s']:.3f}")
PYEOF
fi
}

# 3c. fsdp-train's own CUDA kernels (--fused-cuda-kernels: the soft cross-entropy and the TTT
# attention's diagonal merge, forward and backward; docs/model.md "Fused CUDA kernels") on the
# fixed-length run of stage 3: tokens/s and MFU against the same run without them and against
# the reference. Their exactness against the composite ops is the [cuda] tests' (stage 6).
skip fused || { stamp "fsdp-train --fused-cuda-kernels"
if fsdp_run fused 120 --fused-cuda-kernels true; then
  "$PY" "$REPO/benchmarks/device/compare.py" "$M/fused-metrics.jsonl" \
    "$M/reference-metrics.jsonl" "$DRAFT" "$SEQ"
  "$PY" - "$M/fused-metrics.jsonl" "$M/fsdp-train-2-metrics.jsonl" <<'PYEOF'
import json, sys
def steady(path):  # tokens/s over the logged windows after the first (warm-up), and the breakdown
    rows = [json.loads(l) for l in open(path) if '"perf/tokens_per_s"' in l][1:]
    if not rows:
        return None, {}
    secs = sum(r["perf/step_time_s"] for r in rows)
    tps = sum(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in rows) / secs
    ms = {p: 1e3 * sum(r.get(f"perf/{p}_s", 0) for r in rows) / len(rows)
          for p in ("forward", "backward", "optimizer", "other")}
    return tps, ms
(f, fm), (p, pm) = steady(sys.argv[1]), steady(sys.argv[2])
if f and p:
    print(f"fused kernels: {f:.0f} tokens/s vs {p:.0f} without: {f / p:.3f}x")
    print("per step (ms), fused vs plain:", ", ".join(f"{k} {fm[k]:.1f}/{pm[k]:.1f}" for k in fm))
PYEOF
fi; }

# 4. Activation checkpointing on the same run: tokens/s and peak memory against the plain run.
skip checkpointing || { stamp "fsdp-train --activation-checkpointing"
fsdp_run checkpointed 90 --activation-checkpointing &&
  "$PY" "$REPO/benchmarks/device/compare.py" --checkpointing "$M/fsdp-train-metrics.jsonl" \
    "$M/checkpointed-metrics.jsonl"; }

# 5. Exactness on the GPU: fsdp-train against the reference in fp32 on small toy features, same
# initial weights and batches, ploss_i/acc_i of 3 steps to 1e-4 (benchmarks/compare/parity.sh;
# one rank, started without mpirun as above).
skip parity || { stamp "parity with the reference on the GPU (fp32, 3 steps)"
printf '#!/bin/sh\nshift 2\nexec "$@"\n' >/tmp/fsdp-single-rank.sh   # drops parity.sh's "-n 1"
rm -rf /tmp/fsdp-device-parity
timeout 120 env DEVICE=cuda RANKS=1 FSDP_PYTHON="$PY" MPIRUN="sh /tmp/fsdp-single-rank.sh" \
  WORK=/tmp/fsdp-device-parity bash "$REPO/benchmarks/compare/parity.sh" "$B/fsdp-train" 2>&1 |
  tail -8; }

# 6. GPU tests (they skip nothing here: a GPU is present).
skip tests || { stamp "GPU tests"
rc_tests=0
for t in "unit_model [cuda]" "unit_shard [cuda]" "mpi_comm [nccl]"; do
  exe="$B/tests/${t%% *}"
  [ -x "$exe" ] || { echo "missing test executable $exe"; rc_tests=1; continue; }
  timeout 60 "$exe" "${t#* }" || { echo "$t: exit code $?"; rc_tests=1; }
done
stamp "GPU tests: $([ $rc_tests -eq 0 ] && echo passed || echo FAILED)"; }

# 7. CPU offload on the GPU host: optimizer state in pinned host memory, AdamW on the CPU
# overlapped with the uploads. 30 steps: the first window holds the pinned host allocations
# (6.3 GiB) and warm-up, so only later windows are steady state; steps 21-22 are profiled
# (offload-profile-summary.txt).
skip offload || { OSTEPS="${FSDP_DEVICE_OFFLOAD_STEPS:-30}"
stamp "fsdp-train --cpu-offload: $OSTEPS steps"
rm -rf /tmp/fsdp-device-offload-profile
STEPS="$OSTEPS" fsdp_run offload 150 --cpu-offload --profile --profile-start-step 20 \
  --profile-num-steps 2 --profile-dir /tmp/fsdp-device-offload-profile
cp /tmp/fsdp-device-offload-profile/rank0.summary.txt "$OUT/offload-profile-summary.txt" 2>/dev/null &&
  head -25 "$OUT/offload-profile-summary.txt" | cut -c1-150
[ -s "$M/offload-metrics.jsonl" ] &&
  "$PY" - "$M/offload-metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "perf/tokens_per_s" in r]
for r in rows:
    print(f"cpu offload step {r['step']}: tokens/s {r['perf/tokens_per_s']:.0f}, peak GPU memory "
          f"{r.get('mem/device_peak_allocated_gib', 0):.1f} GiB, host RSS "
          f"{r.get('mem/host_peak_rss_gib', 0):.1f} GiB")
PYEOF
}
# 8. Long samples (docs/benchmarks.md "Memory model for long samples"): one training step of the
# llama3-8B draft per length on one H200 (SP 1: one GPU), chunked head automatic, peak GPU
# memory against `fsdp-train memory-plan`'s estimate (calibrated with the 0.8 GiB the S = 2048
# run measured above it); the longest length that runs is the longest sample per GPU.
skip longctx || { LONG="${FSDP_DEVICE_LONG_LENGTHS:-16384 32768 65536}"
for L in $LONG; do
  DATAL="/tmp/fsdp-device-data-long-$L"
  if [ ! -f "$DATAL/toy_data.json" ]; then
    stamp "generating 2 samples of $L tokens"
    rm -rf "$DATAL"
    timeout 150 "$B/fsdp-train" gen-toy-data --out "$DATAL" --num-samples 2 --min-len "$L" \
      --max-len "$L" --hidden-size 4096 --vocab-size 128256 --draft-vocab-size 32000 \
      --samples-per-dir 2 >>"$OUT/build.log" 2>&1 || { tail -5 "$OUT/build.log"; rm -rf "$DATAL"; continue; }
  fi
  stamp "S = $L: 2 steps"
  RUN_DATA="$DATAL" RUN_LOG=1 STEPS=2 SEQ="$L" fsdp_run "long-$L" 150 || continue
  "$B/fsdp-train" memory-plan --draft-model-config "$DRAFT" --max-length "$L" --sp-sizes 1 \
    --overhead-gib 0.8 | sed -n 4,5p
  "$PY" - "$M/long-$L-metrics.jsonl" "$L" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peak = max((r.get("mem/device_peak_allocated_gib", 0) for r in rows), default=0)
tps = [r["perf/tokens_per_s"] for r in rows if "perf/tokens_per_s" in r]
print(f"S = {sys.argv[2]}: peak GPU memory {peak:.1f} GiB, tokens/s {tps[-1] if tps else 0:.0f}")
PYEOF
done; }
stamp "done"
